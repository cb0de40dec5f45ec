"""Every name a GPT parameter has in the layouts mds reads and writes, and how each lies over
tensor-parallel ranks and pipeline stages: one torch-free table for the model, its pipeline and its
Hugging Face conversion (this package) and for every checkpoint reader and writer (mds_checkpoint,
`engine_names.py` translates with it). A new layout is an entry here.

Namings, each translated to and from the plain one:
- plain: `mds_model.GPT`'s own (`layers.3.mlp.dense_4h_to_h.weight`), below.
- Megatron's nested module (`MEGATRON_PREFIXES`): `language_model.embedding.X`,
  `language_model.encoder.layers.I.X` (version 0: `language_model.transformer.`, older layers
  `attention.` for `self_attention.`: `LAYER_ALIASES`), as GPTModel's
  state_dict_for_save_checkpoint writes it and DeepSpeed's plain engine names its parameters.
- DeepSpeed's PipelineModule: `tied_modules.embed.X` (`TIED_PREFIX`) and `{spec index}.X`, the spec
  indices of each fork's GPTModelPipe (`PIPE_GAPS`, `pipe_layer_indices`).
- Hugging Face's GPT2LMHeadModel: parameters.py's `hf_name`s, and `HF_QKV` (reordered).
Names, shapes, tensor-parallel splits and Hugging Face names of the parameters themselves come from
one table, `parameters.py`; this module adds how other layouts spell and number them. The
query_key_value rows of one TP rank: `QKV_ORDERS`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import GPTConfig

# The plain GPT's names and their tensor-parallel split: parameters.py's table.
from .parameters import (  # noqa: F401
    FINAL_NORM,
    OUTPUT_LAYER,
    WORD_EMBEDDINGS,
    Split,
    split_of_local,
)

_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
# Older Megatron spellings inside a layer.
LAYER_ALIASES = {"attention.": "self_attention."}


def split_of(name: str, config: GPTConfig) -> Split:
    """The split rule of a plain-GPT parameter name in this config's architecture (parameters.py's
    split kind)."""
    match = _LAYER.fullmatch(name)
    return split_of_local(name if match is None else match.group(2), config)


def layer_name(index: int, local: str) -> str:
    return f"layers.{index}.{local}"


def layer_of(name: str) -> tuple[int, str] | None:
    """(layer index, name inside the layer) of `layers.I.X`, else None."""
    match = _LAYER.fullmatch(name)
    return None if match is None else (int(match.group(1)), match.group(2))


def canonical_layer_key(key: str) -> str:
    """A name inside a layer file or Megatron encoder, in today's spelling."""
    for old, new in LAYER_ALIASES.items():
        if key.startswith(old):
            return new + key[len(old) :]
    return key


# --- DeepSpeed pipeline numbering -------------------------------------------------------------

# Where each fork's GPTModelPipe puts the embedding, the transformer layers and the final norm
# in its spec list: the `layer_XX` numbers of its checkpoint files and the `{XX}.name` parameter
# names of DeepSpeed's pipeline engine. Torch-free, so checkpoint readers use it without DeepSpeed.
#
# Spec 0 is a cast, 1 the embedding; then the transformer layers one after another and the final
# norm, each block `gap` after the one before. bigscience's fork puts a transpose lambda between
# them (gap 2: layers 3..N+2, norm N+4); deepspeedai/Megatron-DeepSpeed's
# (megatron/model/gpt_model.py) does not (gap 1: layers 2..N+1, norm N+2). mds_model's pipeline
# numbers as deepspeedai's does, so that fork's `pretrain_gpt.py --load` reads mds-train's files.

PIPE_GAPS = {"bigscience": 2, "deepspeedai": 1}
# The pipeline engine's file of one spec index (XX) and TP rank (YY).
LAYER_FILE = re.compile(r"layer_(\d+)-model_(\d+)-model_states\.pt")
EMBEDDING_INDEX = 1
OWN_NUMBERING = "deepspeedai"


def pipe_layer_indices(num_layers: int, numbering: str = OWN_NUMBERING) -> tuple[int, int]:
    """(spec index of the first transformer layer, of the final norm) in a fork's numbering."""
    gap = PIPE_GAPS[numbering]
    first = EMBEDDING_INDEX + gap
    return first, first + num_layers - 1 + gap


def pipe_numbering(indices: list[int]) -> str | None:
    """Which fork's GPTModelPipe numbered these layer files (embedding, layers, final norm, in
    order); None when neither did."""
    num_layers = len(indices) - 2
    for numbering in PIPE_GAPS:
        first, final = pipe_layer_indices(num_layers, numbering)
        if indices == [EMBEDDING_INDEX, *range(first, first + num_layers), final]:
            return numbering
    return None


def renumber(index: int, num_layers: int, *, source: str, target: str) -> int:
    """A spec index holding parameters in `source`'s numbering -> the same part's in `target`'s."""
    first, final = pipe_layer_indices(num_layers, source)
    target_first, target_final = pipe_layer_indices(num_layers, target)
    if index == EMBEDDING_INDEX:
        return EMBEDDING_INDEX
    if first <= index < first + num_layers:
        return target_first + index - first
    if index in (final, final + 1):  # the final norm, the untied head one after it
        return target_final + index - final
    raise ValueError(f"spec index {index} holds no parameters of a {num_layers}-layer GPTModelPipe")


# --- Megatron's nested module and DeepSpeed's engines --------------------------------------------

MEGATRON_PREFIXES = {  # Megatron's nested names -> the plain GPT's
    "language_model.embedding.": "embedding.",
    "language_model.output_layer.": "output_layer.",  # the untied head (language_model.py)
    "language_model.encoder.": "",
    "language_model.transformer.": "",  # checkpoint_version 0's spelling
}
TIED_PREFIX = "tied_modules.embed."  # the pipeline engine's tied embedding (TiedLayerSpec "embed")
# The untied head: upstream's LMHeadPipe (megatron/model/transformer.py) holds it as `lm_head`, in
# its own layer file one spec after the final norm (deepspeedai's GPTModelPipe); the untied
# embedding is a plain LayerSpec, `{EMBEDDING_INDEX}.word_embeddings.weight` to the engine.
LM_HEAD = "lm_head."

# --- Hugging Face's GPT2LMHeadModel -----------------------------------------------------------

# The fused QKV (HF: `attn.c_attn`, columns [all q | all k | all v]; ours rows per head).
HF_QKV = "self_attention.query_key_value"

# --- query_key_value row orders -------------------------------------------------------------------

# How one TP rank's query_key_value rows are ordered, as axes of np heads on the rank, the 3 of q,
# k, v and hn the head size. mds's, and Megatron's from checkpoint_version 2.0, is per head
# [np, 3, hn]. Megatron's `fix_query_key_value_ordering` (megatron/checkpointing.py) defines the
# older ones: version 0 [3, np, hn], version 1.0 [np, hn, 3]. deepspeedai/Megatron-DeepSpeed from
# commit 676a482 (FPDT, 2024-12-04) builds the rows as [Q | K | V] blocks, [3, np, hn], still
# writing version 3.0 (its args tell: `ds_sequence_parallel_fpdt*`).
QKV_PER_HEAD, QKV_BLOCKS, QKV_HEAD_DIM_FIRST = "np,3,hn", "3,np,hn", "np,hn,3"
QKV_ORDERS = (QKV_PER_HEAD, QKV_BLOCKS, QKV_HEAD_DIM_FIRST)
# (first checkpoint_version, its order), newest last: Megatron's versions.
QKV_ORDER_SINCE_VERSION = ((0.0, QKV_BLOCKS), (1.0, QKV_HEAD_DIM_FIRST), (2.0, QKV_PER_HEAD))


def qkv_order_of_version(version: float) -> str:
    """The row order Megatron's checkpoint_version means (before FPDT's blocks)."""
    return [order for since, order in QKV_ORDER_SINCE_VERSION if version >= since][-1]
