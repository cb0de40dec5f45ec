"""A process group's stand-in for building one tensor-parallel rank's shards in one process:
construction reads only the group's rank and size (`ParallelGroups`), and draws no collective."""

from __future__ import annotations

from mds_model import ParallelGroups


class StandInGroup:
    """Answers `rank()` and `size()` as a `torch.distributed.ProcessGroup` of `size` ranks would
    on rank `rank`; any communication through it fails."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def tensor_parallel_rank(rank: int, size: int) -> ParallelGroups:
    """Groups for tensor-parallel rank `rank` of `size`, without torch.distributed."""
    return ParallelGroups(tp_group=StandInGroup(rank, size))
