"""Process groups passed explicitly (no globals) and Megatron's four tensor-parallel mappings.

Rank layout follows Megatron and DeepSpeed's `PipeModelDataParallelTopology`: tensor-parallel ranks
are consecutive, data-parallel next, pipeline stages outermost (rank = (pp * dp + d) * tp + t).
The mappings are Megatron's `mpu/mappings.py` autograd functions: copy (identity forward, all-reduce
backward), reduce (all-reduce forward, identity backward), gather/scatter along the last dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's place in the (pp, dp, tp) grid, held as its three process groups: each rank
    and size is the group's own (`ProcessGroup.rank()`, `.size()`), so the degrees live in the
    groups alone. A None group means size 1, no communication."""

    tp_group: dist.ProcessGroup | None = None
    dp_group: dist.ProcessGroup | None = None
    pp_group: dist.ProcessGroup | None = None

    @property
    def tp_rank(self) -> int:
        return _rank_in(self.tp_group)

    @property
    def tp_size(self) -> int:
        return _size_of(self.tp_group)

    @property
    def dp_rank(self) -> int:
        return _rank_in(self.dp_group)

    @property
    def dp_size(self) -> int:
        return _size_of(self.dp_group)

    @property
    def pp_rank(self) -> int:
        return _rank_in(self.pp_group)

    @property
    def pp_size(self) -> int:
        return _size_of(self.pp_group)

    @classmethod
    def build(cls, *, tensor_parallel_size: int, pipeline_parallel_size: int = 1) -> ParallelGroups:
        """Creates every group of the grid; collective: every rank calls it, in the same order."""
        if not dist.is_initialized():
            raise ValueError(
                "torch.distributed must be initialised before building parallel groups"
            )
        world, rank = dist.get_world_size(), dist.get_rank()
        tp, pp = tensor_parallel_size, pipeline_parallel_size
        if world % (tp * pp):
            raise ValueError(
                f"world size {world} is not divisible by tensor ({tp}) x pipeline ({pp}) "
                "parallel size"
            )
        dp = world // (tp * pp)

        def coords(r: int) -> tuple[int, int, int]:
            return r // (dp * tp), (r // tp) % dp, r % tp

        found: dict[str, dist.ProcessGroup | None] = {}
        for kind, axis in (("tp", 2), ("dp", 1), ("pp", 0)):
            # Every rank creates every group of this kind: new_group is collective over the world.
            members_by_key: dict[tuple[int, ...], list[int]] = {}
            for r in range(world):
                key = tuple(c for i, c in enumerate(coords(r)) if i != axis)
                members_by_key.setdefault(key, []).append(r)
            for members in members_by_key.values():
                group = dist.new_group(members)
                if rank in members:
                    found[kind] = group
        return cls(
            tp_group=found["tp"] if tp > 1 else None,
            dp_group=found["dp"] if dp > 1 else None,
            pp_group=found["pp"] if pp > 1 else None,
        )


def _rank_in(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else group.rank()


def _size_of(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else group.size()


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    if group is None or dist.get_world_size(group) == 1:
        return x
    x = x.contiguous()
    dist.all_reduce(x, group=group)
    return x


def _split_last(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    if group is None:
        return x
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    return x.chunk(size, dim=-1)[rank].contiguous()


def _gather_last(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    if group is None:
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


class _CopyToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone(), ctx.group), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        # Clone so that the all-reduce (in place) never writes into a tensor autograd saved.
        return _all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group), None


class _GatherFromTensorParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad, ctx.group), None


def copy_to_tensor_parallel(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if group is None else _CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if group is None else _ReduceFromTensorParallel.apply(x, group)


def scatter_to_tensor_parallel(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if group is None else _ScatterToTensorParallel.apply(x, group)


def gather_from_tensor_parallel(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if group is None else _GatherFromTensorParallel.apply(x, group)


# Sequence parallelism (Korthikanti et al. 2022): outside the tensor-parallel matmuls, activations
# (S, B, H) are split along S over the TP ranks; the all-reduce of a row-parallel output becomes a
# reduce-scatter and the copy before a column-parallel input an all-gather.


def _split_first(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    return x.chunk(dist.get_world_size(group), dim=0)[dist.get_rank(group)].contiguous()


def _gather_first(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=0)


def _reduce_scatter_first(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    size = dist.get_world_size(group)
    if dist.get_backend(group) == "gloo":  # gloo has no reduce-scatter: all-reduce, keep a slice
        return _split_first(_all_reduce(x.clone(), group), group)
    out = torch.empty((x.shape[0] // size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
    return out


class _ScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_first(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first(grad, ctx.group), None


class _GatherFromSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_first(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_first(grad, ctx.group), None


class _ReduceScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_first(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_first(grad, ctx.group), None


def scatter_to_sequence_parallel(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Keep this rank's slice of dim 0 (backward: all-gather)."""
    return x if group is None else _ScatterToSequenceParallel.apply(x, group)


def gather_from_sequence_parallel(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-gather along dim 0 (backward: reduce-scatter, the sum of the ranks' partial grads)."""
    return x if group is None else _GatherFromSequenceParallel.apply(x, group)


def reduce_scatter_to_sequence_parallel(
    x: torch.Tensor, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """Sum over ranks, keep this rank's slice of dim 0 (backward: all-gather)."""
    return x if group is None else _ReduceScatterToSequenceParallel.apply(x, group)
