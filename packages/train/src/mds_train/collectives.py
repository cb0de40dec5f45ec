"""The two flat-tensor collectives ZeRO's shards use, under the names this torch has:
`all_gather_single` / `reduce_scatter_single` from torch 2.13 (which deprecates
`all_gather_into_tensor` / `reduce_scatter_tensor`, the names before). NCCL and gloo both run
them, in place too (`tensor` the rank's slice of `out`, or `out` the rank's slice of `tensor`)."""

from __future__ import annotations

import torch
import torch.distributed as dist

_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather(out: torch.Tensor, tensor: torch.Tensor, group, *, async_op: bool = False):
    """Every rank's `tensor` (the same size on each) into `out`, end to end in rank order."""
    return _ALL_GATHER(out, tensor, group=group, async_op=async_op)


def reduce_scatter_average(out: torch.Tensor, tensor: torch.Tensor, group, *, async_op: bool):
    """The mean over the group of `tensor`, rank r's r-th equal part of it into `out`."""
    return _REDUCE_SCATTER(out, tensor, op=dist.ReduceOp.AVG, group=group, async_op=async_op)


def gathered(tensor: torch.Tensor, group, size: int) -> torch.Tensor:
    """Every rank's equal-shaped `tensor` (`size` ranks), concatenated along dim 0."""
    out = torch.empty((size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype,
                      device=tensor.device)  # fmt: skip
    all_gather(out, tensor.contiguous(), group)
    return out
