"""Tensor-parallel shards <-> whole tensors, one parameter at a time (the split kind of
mds_model's parameter table, through `naming.split_of` in the model's config, says how; the
ranges each rank holds are `Split.rank_blocks`': one block, or a gated MLP's block of each half).

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
from mds_model import GPTConfig
from mds_model.naming import Split, split_of
from mds_model.parameters import GATED

from .arrays import bitwise_equal, to_float32


def _rank_slices(split: Split, tensor: np.ndarray, tp: int, rank: int) -> list[np.ndarray]:
    """Views of the whole tensor's blocks that TP rank `rank` holds, in its order."""
    blocks = split.rank_blocks(tensor.shape[split.dim], tp, rank)
    index = [slice(None)] * tensor.ndim
    views = []
    for start, stop in blocks:
        index[split.dim] = slice(start, stop)
        views.append(tensor[tuple(index)])
    return views


def merge_shards(
    name: str,
    shards: Sequence[np.ndarray],
    *,
    config: GPTConfig,
    where: str,
    allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = None,
) -> np.ndarray:
    """The whole tensor from its TP shards (rank order) in `config`'s architecture; `where`
    names the files in errors. `allocate(shape, dtype)` gives the tensor that split shards are
    joined into (a reused buffer, `BufferPool.take`); a replicated parameter is rank 0's copy
    itself."""
    split = split_of(name, config)
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
    shape = list(first.shape)
    shape[split.dim] *= len(shards)
    if split.kind != GATED:  # one contiguous block per rank
        if allocate is None:
            return np.concatenate(shards, axis=split.dim)
        return np.concatenate(shards, axis=split.dim, out=allocate(tuple(shape), first.dtype))
    whole = (allocate or np.empty)(tuple(shape), first.dtype)
    for rank, shard in enumerate(shards):  # each rank's blocks in its order: [gate_r; up_r]
        offset = 0
        for piece in _rank_slices(split, whole, len(shards), rank):
            size = piece.shape[split.dim]
            piece[...] = shard[(slice(None),) * split.dim + (slice(offset, offset + size),)]
            offset += size
    return whole


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
    name: str,
    tensor: np.ndarray,
    tensor_model_parallel_size: int,
    *,
    config: GPTConfig,
    padded_vocab_size: int,
) -> list[np.ndarray]:
    """A whole tensor's shards for `tensor_model_parallel_size` ranks (rank order) in `config`'s
    architecture: views of it, or for a gated MLP each rank's two blocks joined."""
    return [
        shard_for_rank(
            name,
            tensor,
            config=config,
            tp_rank=rank,
            tensor_model_parallel_size=tensor_model_parallel_size,
            padded_vocab_size=padded_vocab_size,
        )
        for rank in range(tensor_model_parallel_size)
    ]


def shard_for_rank(
    name: str,
    tensor: np.ndarray,
    *,
    config: GPTConfig | None = None,
    split: Split | None = None,
    tp_rank: int,
    tensor_model_parallel_size: int,
    padded_vocab_size: int,
) -> np.ndarray:
    """One rank's shard of a whole tensor (what a loader at the target topology takes): its
    split from `config`'s architecture, or as given (`split`: a universal checkpoint's files
    say theirs)."""
    if split is None:
        if config is None:
            raise TypeError("shard_for_rank needs the config or the split")
        split = split_of(name, config)
    if split.vocab:
        tensor = resize_vocab(tensor, padded_vocab_size)
    if split.dim is None or tensor_model_parallel_size == 1:
        return tensor
    try:
        pieces = _rank_slices(split, tensor, tensor_model_parallel_size, tp_rank)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=split.dim)
