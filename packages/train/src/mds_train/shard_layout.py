"""Which elements of a ZeRO-1/2 flat parameter group each data-parallel rank owns.

The flat group is DeepSpeed's (`BF16_Optimizer._setup_for_real_optimizer`): the group's
parameters end to end in model order, zero-padded to a multiple of 2 x DP. DeepSpeed gives rank r
the r-th of DP contiguous partitions; its files hold that partition. mds-train steps another cut
of the same buffer, Megatron-core's distributed optimizer's: the buffer is cut into buckets, and
rank r owns the r-th of DP equal slices of every bucket. A bucket's averaged gradient is then one
reduce-scatter (half an all-reduce's bytes) that lands each rank's slice, and its updated weights
one all-gather that lands in place; with DeepSpeed's cut a bucket's gradient belongs to one or two
ranks and needs an all-reduce. Checkpoints convert between the two (sharded_master_weights.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

# DeepSpeed's `nccl_start_alignment_factor`: a group's flat length is a multiple of 2 x DP, so
# every DeepSpeed partition starts on a 4-byte boundary.
START_ALIGNMENT = 2
# A bucket (all but the last) is a multiple of 128 x DP elements: every slice starts 256-byte
# aligned in bf16.
BUCKET_ALIGNMENT = 128


@dataclass(frozen=True)
class Fragment:
    """The piece of one parameter inside this rank's partition."""

    index: int  # the parameter's position in its group
    start: int  # where the piece begins in the flattened parameter
    numel: int
    partition_start: int  # where it begins in the partition


@dataclass(frozen=True)
class Slice:
    """This rank's part of one bucket: `numel` elements from `start` of the flat group, at
    `partition_start` of the rank's partition (its slices end to end, in bucket order)."""

    bucket: int
    start: int
    numel: int
    partition_start: int


@dataclass(frozen=True)
class ShardLayout:
    numels: tuple[int, ...]  # the group's parameters' element counts, in the flat order
    rank: int
    size: int  # data-parallel ranks
    buckets: tuple[tuple[int, int], ...]  # (start, numel) of each bucket in the flat group

    @cached_property
    def offsets(self) -> list[int]:
        """Each parameter's first element in the flat group."""
        out, offset = [], 0
        for numel in self.numels:
            out.append(offset)
            offset += numel
        return out

    @property
    def unpadded_numel(self) -> int:
        return sum(self.numels)

    @property
    def padded_numel(self) -> int:
        alignment = START_ALIGNMENT * self.size
        return -(-self.unpadded_numel // alignment) * alignment

    @cached_property
    def slices(self) -> list[Slice]:
        out, partition_start = [], 0
        for b, (start, numel) in enumerate(self.buckets):
            share = numel // self.size
            out.append(Slice(b, start + self.rank * share, share, partition_start))
            partition_start += share
        return out

    @cached_property
    def _slices_by_start(self) -> tuple[list[Slice], list[int]]:
        ordered = sorted(self.slices, key=lambda piece: piece.start)
        return ordered, [piece.start for piece in ordered]

    def slices_overlapping(self, start: int, numel: int) -> list[Slice]:
        """This rank's slices that share elements with [start, start + numel) of the flat group,
        found by bisection (a load asks for every chunk of every rank's partition)."""
        ordered, starts = self._slices_by_start
        first = max(0, bisect.bisect_right(starts, start) - 1)
        out = []
        for piece in ordered[first:]:
            if piece.start >= start + numel:
                break
            if piece.start + piece.numel > start:
                out.append(piece)
        return out

    @property
    def partition_numel(self) -> int:
        return self.padded_numel // self.size

    @cached_property
    def fragments(self) -> list[Fragment]:
        """The pieces of the parameters in this rank's slices."""
        return fragments_in(
            self.numels, [(s.start, s.numel, s.partition_start) for s in self.slices]
        )

    # --- DeepSpeed's cut, for its files ----------------------------------------------------

    @property
    def deepspeed_start(self) -> int:
        """Where this rank's DeepSpeed partition (`partition_numel` elements) begins."""
        return self.rank * self.partition_numel

    @cached_property
    def deepspeed_fragments(self) -> list[Fragment]:
        return fragments_in(self.numels, [(self.deepspeed_start, self.partition_numel, 0)])

    @property
    def deepspeed_padding(self) -> int:
        """This rank's padding elements, as DeepSpeed records them: all on the partitions past
        the parameters' end."""
        end = self.deepspeed_start + self.partition_numel
        return max(0, min(self.partition_numel, end - self.unpadded_numel))

    def bucket_params(self, b: int) -> list[tuple[int, int, int, int]]:
        """(parameter index, start in the flattened parameter, elements, start in the bucket) of
        each parameter piece in bucket `b`."""
        start, numel = self.buckets[b]
        return [
            (f.index, f.start, f.numel, f.partition_start)
            for f in fragments_in(self.numels, [(start, numel, 0)])
        ]


def shard_layout(numels: list[int], *, rank: int, size: int, bucket_elements: int) -> ShardLayout:
    """The group's buckets, cut as backward fills them: from the group's end, a bucket closes
    at the parameter that takes it to `bucket_elements` or more, and a parameter of that size
    or more gets a bucket of its own (the word embeddings', whose gradient is ready last, holds
    back no other). Each cut is moved up to a multiple of BUCKET_ALIGNMENT x DP, so every
    slice starts aligned; the last bucket ends at the group's end (a multiple of 2 x DP). One
    rank: one bucket, the whole group."""
    layout = ShardLayout(tuple(numels), rank, size, ())
    padded = layout.padded_numel
    if size == 1:
        return ShardLayout(tuple(numels), rank, size, ((0, padded),))
    cuts, filled = {0, padded}, 0
    for index in reversed(range(len(numels))):
        start, numel = layout.offsets[index], numels[index]
        if filled and numel >= bucket_elements:
            cuts.add(start + numel)
            filled = 0
        filled += numel
        if filled >= bucket_elements:
            cuts.add(start)
            filled = 0
    alignment = BUCKET_ALIGNMENT * size
    bounds = sorted({min(padded, -(-cut // alignment) * alignment) for cut in cuts})
    buckets = tuple((low, high - low) for low, high in zip(bounds, bounds[1:], strict=False))
    return ShardLayout(tuple(numels), rank, size, buckets)


def fragments_in(numels: tuple[int, ...] | list[int], ranges) -> list[Fragment]:
    """The pieces of consecutive parameters of `numels` (laid end to end) inside each of
    `ranges`, given as (start in the flat group, elements, where the range begins in the
    partition), in the ranges' order."""
    out = []
    for begin, numel, partition_start in ranges:
        end, offset = begin + numel, 0
        for index, count in enumerate(numels):
            low, high = max(offset, begin), min(offset + count, end)
            if low < high:
                out.append(Fragment(index, low - offset, high - low, partition_start + low - begin))
            offset += count
            if offset >= end:
                break
    return out
