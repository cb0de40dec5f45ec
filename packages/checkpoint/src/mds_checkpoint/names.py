"""Parameter names and how each is split over tensor-parallel ranks (Megatron's `mpu/layers.py`).

Every reader turns its files' names into the plain `mds_model.GPT` names
(`layers.3.mlp.dense_4h_to_h.weight`), every writer goes from them; the split rule is one table:
column-parallel weights on dim 0 (QKV rows grouped `[heads, 3, head_dim]`, so plain concatenation
keeps the grouping), row-parallel on dim 1, the word embeddings' padded vocabulary rows on dim 0,
the rest replicated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WORD_EMBEDDINGS = "embedding.word_embeddings.weight"
POSITION_EMBEDDINGS = "embedding.position_embeddings.weight"
EMBED_NORM = ("embedding.word_embeddings.norm.weight", "embedding.word_embeddings.norm.bias")
FINAL_NORM = ("final_layernorm.weight", "final_layernorm.bias")

# Names inside one transformer layer, in the order the module registers them.
LAYER_NAMES = (
    "input_layernorm.weight",
    "input_layernorm.bias",
    "self_attention.query_key_value.weight",
    "self_attention.query_key_value.bias",
    "self_attention.dense.weight",
    "self_attention.dense.bias",
    "post_attention_layernorm.weight",
    "post_attention_layernorm.bias",
    "mlp.dense_h_to_4h.weight",
    "mlp.dense_h_to_4h.bias",
    "mlp.dense_4h_to_h.weight",
    "mlp.dense_4h_to_h.bias",
)
_COLUMN = {
    "self_attention.query_key_value.weight",
    "self_attention.query_key_value.bias",
    "mlp.dense_h_to_4h.weight",
    "mlp.dense_h_to_4h.bias",
}
_ROW = {"self_attention.dense.weight", "mlp.dense_4h_to_h.weight"}
_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
# Older Megatron spellings inside a layer.
_ALIASES = {"attention.": "self_attention."}


@dataclass(frozen=True)
class Split:
    """How one parameter lies over TP ranks: `dim` None is replicated; `vocab` marks the padded
    word-embedding rows (re-padded when TP changes)."""

    dim: int | None
    vocab: bool = False


def split_of(name: str) -> Split:
    """The split rule of a plain-GPT parameter name."""
    if name == WORD_EMBEDDINGS:
        return Split(0, vocab=True)
    match = _LAYER.fullmatch(name)
    if match:
        local = match.group(2)
        if local in _COLUMN:
            return Split(0)
        if local in _ROW:
            return Split(1)
    return Split(None)


def layer_name(index: int, local: str) -> str:
    return f"layers.{index}.{local}"


def layer_of(name: str) -> tuple[int, str] | None:
    """(layer index, name inside the layer) of `layers.I.X`, else None."""
    match = _LAYER.fullmatch(name)
    return None if match is None else (int(match.group(1)), match.group(2))


def canonical_layer_key(key: str) -> str:
    """A name inside a layer file or Megatron encoder, in today's spelling."""
    for old, new in _ALIASES.items():
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def embedding_names(*, learned_positions: bool, embed_layernorm: bool) -> tuple[str, ...]:
    names = [WORD_EMBEDDINGS]
    if embed_layernorm:
        names += EMBED_NORM
    if learned_positions:
        names.append(POSITION_EMBEDDINGS)
    return tuple(names)


def model_names(num_layers: int, *, learned_positions: bool, embed_layernorm: bool) -> list[str]:
    """Every parameter of the plain GPT, in `GPT.named_parameters()` order."""
    names = list(
        embedding_names(learned_positions=learned_positions, embed_layernorm=embed_layernorm)
    )
    for i in range(num_layers):
        names += [layer_name(i, local) for local in LAYER_NAMES]
    return names + list(FINAL_NORM)
