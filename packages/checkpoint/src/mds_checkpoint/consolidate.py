"""`load_consolidated`: any checkpoint as one TP=1, PP=1 model (the sampler's and exporters' view).

The word embeddings (and an untied output layer) keep every padded row of the source (Megatron
trains them); every other tensor
is the source's shards joined, in the source's dtype, as a torch tensor (the readers' numpy arrays
are shared, not copied).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from mds_model import GPTConfig, for_tensor_parallel
from mds_model.naming import OUTPUT_LAYER, WORD_EMBEDDINGS

from .arrays import as_tensor
from .meta import CheckpointMeta
from .partition import resize_vocab
from .source import Source, merged_part, open_source

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ConsolidatedModel:
    """A whole model: `config` at TP=1 (PP does not enter a GPTConfig), `meta` the checkpoint's
    description (its meta.json, or what Megatron's args say), `state_dict` for
    `mds_model.GPT(config).load_state_dict`."""

    config: GPTConfig
    meta: CheckpointMeta
    state_dict: dict[str, torch.Tensor]


def single_rank_config(config: GPTConfig, tensor_model_parallel_size: int = 1) -> GPTConfig:
    """The same model split over another tensor-parallel size, with the source's vocabulary rows
    wherever the target TP divides them: Megatron trains the padding rows and they take part in
    its softmax, so re-padding to Megatron's multiple of 128 x TP would change the function (a
    TP=2 GPT-2 has 50432 rows, TP=1 pads to 50304: the loss moves by the dropped rows' share;
    zero rows added the other way move it too). Only rows TP does not divide are re-padded
    Megatron's way, from the tokenizer's vocabulary. ValueError where TP does not split it."""
    tp, rows = tensor_model_parallel_size, config.padded_vocab_size
    if rows % tp:
        return for_tensor_parallel(dataclasses.replace(config, pad_vocab_size_to=None), tp)
    target = for_tensor_parallel(config, tp)
    if target.padded_vocab_size != rows:
        target = dataclasses.replace(target, pad_vocab_size_to=rows)
    return target


def consolidate(source: Source) -> ConsolidatedModel:
    config = single_rank_config(source.config, 1)
    state_dict: dict[str, torch.Tensor] = {}
    for part in source.parts():
        for name, tensor in merged_part(source, part).items():
            if name in (WORD_EMBEDDINGS, OUTPUT_LAYER):
                tensor = resize_vocab(tensor, config.padded_vocab_size)
            state_dict[name] = as_tensor(np.ascontiguousarray(tensor))
    return ConsolidatedModel(config=config, meta=source.meta, state_dict=state_dict)


def load_consolidated(path: str | Path, *, iteration: int | None = None) -> ConsolidatedModel:
    """The checkpoint at `path` as one TP=1 model.

    path: a save folder (`latest`, or Megatron's `latest_checkpointed_iteration.txt`) or one
    checkpoint folder (`global_stepN`, `iter_NNNNNNN`, `release`); iteration: pick
    `global_stepN` / `iter_N` in a save folder instead of the newest. Any TP/PP/ZeRO layout that
    mds-train, Megatron-DeepSpeed or Megatron writes. ValueError with one line when the path is
    not a readable checkpoint.
    """
    return consolidate(open_source(path, iteration=iteration))
