"""Tensor-parallel shards <-> whole tensors, one parameter at a time (`names.split_of` says how).

Merging concatenates shards on the split dimension and checks that replicated copies agree
(Megatron's `merge_mp_partitions` silently takes rank 0's); splitting chunks a whole tensor for
the target's ranks. The word embeddings' rows are the padded vocabulary: `resize_vocab` cuts or
zero-pads them to the target's padded size (Megatron truncates with a `***WARNING***`; padding
rows are never real tokens, so this changes no real token's embedding).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .names import split_of


def merge_shards(name: str, shards: Sequence[torch.Tensor], *, where: str) -> torch.Tensor:
    """The whole tensor from its TP shards (rank order); `where` names the files in errors."""
    split = split_of(name)
    first = shards[0]
    if split.dim is None:
        for rank, shard in enumerate(shards[1:], start=1):
            if shard.shape != first.shape:
                raise ValueError(
                    f"{where}: {name} has shape {tuple(first.shape)} on TP rank 0 but "
                    f"{tuple(shard.shape)} on TP rank {rank}"
                )
            if not torch.equal(shard, first):
                difference = (shard.float() - first.float()).abs().max().item()
                raise ValueError(
                    f"{where}: {name} is replicated but TP rank {rank}'s copy differs from rank "
                    f"0's (largest difference {difference:.3g}); the checkpoint is inconsistent"
                )
        return first
    for rank, shard in enumerate(shards):
        if shard.dim() <= split.dim or shard.shape != first.shape:
            raise ValueError(
                f"{where}: {name} has shape {tuple(shard.shape)} on TP rank {rank} but "
                f"{tuple(first.shape)} on TP rank 0; shards of one parameter must agree"
            )
    if len(shards) == 1:
        return first
    return torch.cat(list(shards), dim=split.dim)


def resize_vocab(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """The padded word-embedding rows cut or zero-padded to `rows`."""
    if tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        return tensor[:rows]
    padding = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat([tensor, padding])


def owned(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor with storage of its own size: `torch.save` of a view writes its whole base."""
    tensor = tensor.contiguous()
    if tensor.storage_offset() or tensor.untyped_storage().nbytes() != (
        tensor.numel() * tensor.element_size()
    ):
        return tensor.clone()
    return tensor


def split_whole(
    name: str, tensor: torch.Tensor, tp_size: int, *, padded_vocab_size: int
) -> list[torch.Tensor]:
    """A whole tensor's shards for `tp_size` ranks (contiguous copies, rank order)."""
    split = split_of(name)
    if split.vocab:
        tensor = resize_vocab(tensor, padded_vocab_size)
    if split.dim is None:
        return [owned(tensor)] * tp_size
    size = tensor.shape[split.dim]
    if size % tp_size:
        raise ValueError(
            f"{name}: dimension {split.dim} has {size} entries, not divisible by the target "
            f"tensor-parallel size {tp_size}"
        )
    return [owned(chunk) for chunk in tensor.chunk(tp_size, dim=split.dim)]


def shard_for_rank(
    name: str, tensor: torch.Tensor, *, tp_rank: int, tp_size: int, padded_vocab_size: int
) -> torch.Tensor:
    """One rank's shard of a whole tensor (what a loader at the target topology takes)."""
    split = split_of(name)
    if split.vocab:
        tensor = resize_vocab(tensor, padded_vocab_size)
    if split.dim is None or tp_size == 1:
        return tensor
    return tensor.chunk(tp_size, dim=split.dim)[tp_rank]
