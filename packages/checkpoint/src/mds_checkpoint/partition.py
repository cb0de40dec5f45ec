"""Tensor-parallel shards <-> whole tensors, one parameter at a time (the split kind of
mds_model's parameter table, through `naming.split_of`, says how).

Merging concatenates shards on the split dimension and checks that replicated copies agree bit for
bit (Megatron's `merge_mp_partitions` silently takes rank 0's); splitting cuts a whole tensor into
the target's ranks' views. The word embeddings' rows are the padded vocabulary: `resize_vocab` cuts
or zero-pads them to the target's padded size (Megatron truncates with a `***WARNING***`; padding
rows are never real tokens, so this changes no real token's embedding). Tensors are numpy arrays
(`arrays.py`: bfloat16 as `BFLOAT16`), as `ptfile` reads and writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
from mds_model.naming import split_of

from .arrays import bitwise_equal, to_float32


def merge_shards(
    name: str,
    shards: Sequence[np.ndarray],
    *,
    where: str,
    allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = None,
) -> np.ndarray:
    """The whole tensor from its TP shards (rank order); `where` names the files in errors.
    `allocate(shape, dtype)` gives the tensor that split shards are joined into (a reused buffer,
    `BufferPool.take`); a replicated parameter is rank 0's copy itself."""
    split = split_of(name)
    first = shards[0]
    if split.dim is None:
        for rank, shard in enumerate(shards[1:], start=1):
            if shard.shape != first.shape:
                raise ValueError(
                    f"{where}: {name} has shape {tuple(first.shape)} on TP rank 0 but "
                    f"{tuple(shard.shape)} on TP rank {rank}"
                )
            if not bitwise_equal(shard, first):
                difference = float(np.abs(to_float32(shard) - to_float32(first)).max())
                raise ValueError(
                    f"{where}: {name} is replicated but TP rank {rank}'s copy differs from rank "
                    f"0's (largest difference {difference:.3g}); the checkpoint is inconsistent"
                )
        return first
    for rank, shard in enumerate(shards):
        if shard.ndim <= split.dim or shard.shape != first.shape:
            raise ValueError(
                f"{where}: {name} has shape {tuple(shard.shape)} on TP rank {rank} but "
                f"{tuple(first.shape)} on TP rank 0; shards of one parameter must agree"
            )
    if len(shards) == 1:
        return first
    if allocate is None:
        return np.concatenate(shards, axis=split.dim)
    shape = list(first.shape)
    shape[split.dim] *= len(shards)
    return np.concatenate(shards, axis=split.dim, out=allocate(tuple(shape), first.dtype))


class BufferPool:
    """The tensors that one part's shards are joined into, reused by the part after next.

    A streamed reshape has two parts in memory (one joined while the previous is written);
    fresh memory for each part costs page faults and zeroing (a tenth of a 345M reshape's CPU
    time), so the buffers of a written part go back here and the next part of the same shapes
    takes them. Only the latest written part's buffers are kept: at most a part's worth idles."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[np.ndarray]] = {}
        self._lent: dict[int, np.ndarray] = {}

    def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        free = self._free.get((shape, dtype))
        tensor = free.pop() if free else np.empty(shape, dtype=dtype)
        self._lent[id(tensor)] = tensor
        return tensor

    def give_back(self, tensors: Iterable[np.ndarray]) -> None:
        """A written part's tensors (those not from this pool are ignored); the buffers given
        back before, and not taken since, are let go."""
        self._free = {}
        for tensor in tensors:
            if self._lent.pop(id(tensor), None) is not None:
                key = (tuple(tensor.shape), tensor.dtype)
                self._free.setdefault(key, []).append(tensor)


def resize_vocab(tensor: np.ndarray, rows: int) -> np.ndarray:
    """The padded word-embedding rows cut or zero-padded to `rows`."""
    if tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        return tensor[:rows]
    padding = np.zeros((rows - tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype)
    return np.concatenate([tensor, padding])


def split_whole(
    name: str, tensor: np.ndarray, tensor_model_parallel_size: int, *, padded_vocab_size: int
) -> list[np.ndarray]:
    """A whole tensor's shards for `tensor_model_parallel_size` ranks (rank order), views of it."""
    split = split_of(name)
    if split.vocab:
        tensor = resize_vocab(tensor, padded_vocab_size)
    if split.dim is None:
        return [tensor] * tensor_model_parallel_size
    size = tensor.shape[split.dim]
    if size % tensor_model_parallel_size:
        raise ValueError(
            f"{name}: dimension {split.dim} has {size} entries, not divisible by the target "
            f"tensor-parallel size {tensor_model_parallel_size}"
        )
    return np.split(tensor, tensor_model_parallel_size, axis=split.dim)


def shard_for_rank(
    name: str,
    tensor: np.ndarray,
    *,
    tp_rank: int,
    tensor_model_parallel_size: int,
    padded_vocab_size: int,
) -> np.ndarray:
    """One rank's shard of a whole tensor (what a loader at the target topology takes)."""
    split = split_of(name)
    if split.vocab:
        tensor = resize_vocab(tensor, padded_vocab_size)
    if split.dim is None or tensor_model_parallel_size == 1:
        return tensor
    return np.split(tensor, tensor_model_parallel_size, axis=split.dim)[tp_rank]
