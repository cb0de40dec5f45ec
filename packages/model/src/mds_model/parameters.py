"""The GPT's parameters as data: one row per parameter, derived from the config, saying its plain
name (`GPT.named_parameters()`'s), its whole shape (all tensor-parallel shards joined), how it
lies over tensor-parallel ranks, whether Megatron decays it, and its names in Hugging Face's
families (GPT2LMHeadModel, LlamaForCausalLM, GPTNeoXForCausalLM, BloomForCausalLM:
`HF_FAMILIES`). `tests/model/test_parameters.py` holds it equal to the module for every preset,
so it cannot drift from what `gpt.py`, `transformer.py` and `attention.py` build.

What derives from it: the names and splits of `naming.py` (and so every checkpoint reader and
writer), the checkpoint's shape checks, the optimizer's decay groups and order (mds-train's
groups and mds-merge-mp's reading of them must agree, or Adam moments go to the wrong
parameter), the Hugging Face conversion's names and shapes, and `mds-model info`'s counts.
The split kinds are Megatron's (`mpu/layers.py`), as Megatron-Bridge's mapping types name them.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import GPTConfig

# How a parameter lies over TP ranks (Megatron's mpu/layers.py):
REPLICATED = "replicated"  # every rank holds it whole: norms, row-parallel biases, positions
ROWS = "rows"  # column-parallel outputs: dim 0 cut in TP contiguous blocks
COLUMNS = "columns"  # row-parallel inputs: dim 1 cut in TP contiguous blocks
VOCAB_ROWS = "vocab_rows"  # the padded vocabulary rows on dim 0, re-padded when TP changes
# query/key/value rows grouped per key/value group, [groups, heads/groups + 2, head_dim] (the
# group's queries, its key, its value; per head [heads, 3, head_dim] without grouping): whole
# groups per rank, so contiguous blocks of dim 0 as ROWS.
QKV = "qkv"
# A gated MLP's dense_h_to_4h: whole [gate; up], each rank [gate_r; up_r] (upstream chunks each
# rank's output in two): rank r holds block r of each half.
GATED = "gated"
SPLITS = (REPLICATED, ROWS, COLUMNS, VOCAB_ROWS, QKV, GATED)
_SPLIT_DIMS = {REPLICATED: None, ROWS: 0, COLUMNS: 1, VOCAB_ROWS: 0, QKV: 0, GATED: 0}


@dataclass(frozen=True)
class Split:
    """How one parameter lies over TP ranks: `kind` one of SPLITS; `dim` the cut dimension (None:
    replicated); `vocab` marks the padded word-embedding rows."""

    kind: str

    def __post_init__(self) -> None:
        if self.kind not in SPLITS:
            raise ValueError(f"split kind {self.kind!r} is not one of {SPLITS}")

    @property
    def dim(self) -> int | None:
        return _SPLIT_DIMS[self.kind]

    @property
    def vocab(self) -> bool:
        return self.kind == VOCAB_ROWS

    def rank_blocks(self, size: int, tensor_model_parallel_size: int, rank: int):
        """The [start, stop) ranges of the whole tensor's `dim` that TP rank `rank` holds, in the
        order the rank holds them (its shard is their concatenation): one block, or one of each
        half for GATED. Torch-free: numpy readers and torch modules cut and join by it."""
        tp = tensor_model_parallel_size
        halves = 2 if self.kind == GATED else 1
        if size % (halves * tp):
            raise ValueError(
                f"{size} entries on dimension {self.dim} do not split into {halves * tp} "
                f"equal blocks ({self.kind}, tensor-parallel size {tp})"
            )
        part, block = size // halves, size // (halves * tp)
        return [(h * part + rank * block, h * part + (rank + 1) * block) for h in range(halves)]


# Hugging Face families (config.json's model_type) whose names the table holds, and where each
# puts transformer layer i's parameters.
GPT2_HF, LLAMA_HF, GPT_NEOX_HF, BLOOM_HF = "gpt2", "llama", "gpt_neox", "bloom"
HF_FAMILIES = (GPT2_HF, LLAMA_HF, GPT_NEOX_HF, BLOOM_HF)
HF_LAYER_PREFIXES = {
    GPT2_HF: "transformer.h.{}.",
    LLAMA_HF: "model.layers.{}.",
    GPT_NEOX_HF: "gpt_neox.layers.{}.",
    BLOOM_HF: "transformer.h.{}.",
}


@dataclass(frozen=True)
class Param:
    """One parameter of the plain GPT."""

    name: str  # GPT.named_parameters()'s: `layers.3.mlp.dense_h_to_4h.weight`
    shape: tuple[int, ...]  # whole: every TP shard joined (the padded vocabulary rows included)
    split: Split
    decay: bool  # Megatron's weight-decay group: embeddings and linear weights, not norms/biases
    hf_name: str | None = None  # GPT2LMHeadModel's (`transformer.h.3.mlp.c_fc.weight`), if any
    hf_transposed: bool = False  # HF's Conv1D stores (in, out) where our linears store (out, in)
    # Every family's name(s): family -> a name, or the names of the parts the rows are cut into
    # (a QKV row: q, k, v; a GATED row: gate, up); families without the parameter are absent.
    # GPT-2's c_attn (a reordering, not a cut) is hf.py's.
    hf_names: tuple[tuple[str, str | tuple[str, ...]], ...] = ()

    def hf_name_in(self, family: str) -> str | tuple[str, ...] | None:
        """Its name (or parts' names) in this Hugging Face family; None: none there."""
        return dict(self.hf_names).get(family)

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def local_shape(self, tensor_model_parallel_size: int) -> tuple[int, ...]:
        """The shape one TP rank holds."""
        dim = self.split.dim
        if dim is None:
            return self.shape
        shape = list(self.shape)
        shape[dim] //= tensor_model_parallel_size
        return tuple(shape)


@dataclass(frozen=True)
class _Row:
    """A parameter of the table before the config sizes it: `local` is its name inside its part
    (a layer, the embedding, the final norm); `hf` GPT-2's name inside its part and whether
    transposed; `hf_more` the other families' names inside the part (`Param.hf_names`)."""

    local: str
    shape: Callable[[GPTConfig], tuple[int, ...]]
    split: str | Callable[[GPTConfig], str]
    decay: bool
    hf: tuple[str, bool] | None = None
    present: Callable[[GPTConfig], bool] = lambda config: True
    hf_more: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)

    def split_for(self, config: GPTConfig) -> Split:
        return Split(self.split if isinstance(self.split, str) else self.split(config))


def _h(config: GPTConfig) -> tuple[int, ...]:
    return (config.hidden_size,)


# The parts of the GPT, each in the order its module registers its parameters.
_WORDS = _Row(
    "embedding.word_embeddings.weight",
    lambda c: (c.padded_vocab_size, c.hidden_size),
    VOCAB_ROWS,
    True,
    ("transformer.wte.weight", False),
    hf_more={
        LLAMA_HF: "model.embed_tokens.weight",
        GPT_NEOX_HF: "gpt_neox.embed_in.weight",
        BLOOM_HF: "transformer.word_embeddings.weight",
    },
)
_EMBED_NORM = (  # BLOOM's LayerNorm on the word embeddings (`--embed-layernorm`)
    _Row(
        "embedding.word_embeddings.norm.weight",
        _h,
        REPLICATED,
        False,
        hf_more={BLOOM_HF: "transformer.word_embeddings_layernorm.weight"},
    ),
    _Row(
        "embedding.word_embeddings.norm.bias",
        _h,
        REPLICATED,
        False,
        hf_more={BLOOM_HF: "transformer.word_embeddings_layernorm.bias"},
    ),
)
_POSITIONS = _Row(
    "embedding.position_embeddings.weight",
    lambda c: (c.max_positions, c.hidden_size),
    REPLICATED,
    True,
    ("transformer.wpe.weight", False),
)


def _norm_bias(config: GPTConfig) -> bool:
    return config.normalization == "layernorm"  # RMSNorm has a weight only


def _linear_bias(config: GPTConfig) -> bool:
    return config.add_bias_linear  # upstream's --disable-bias-linear drops the four


def _mlp_rows(config: GPTConfig) -> int:
    return 2 * config.ffn_size if config.gated else config.ffn_size


def _mlp_split(config: GPTConfig) -> str:
    return GATED if config.gated else ROWS


def _megatron_named(local: str, llama: str | tuple[str, ...] | None) -> dict:
    """A layer row's names in the families that keep Megatron's names inside a layer (BLOOM's
    self_attention, GPT-NeoX's attention), and Llama's own (None: none there)."""
    names = {
        GPT_NEOX_HF: local.replace("self_attention.", "attention."),
        BLOOM_HF: local,
    }
    return names if llama is None else {**names, LLAMA_HF: llama}


def _llama_pair(part: str, which: str) -> tuple[str, ...]:
    return tuple(f"{part}{name}.{which}" for name in ("gate_proj", "up_proj"))


def _llama_qkv(which: str) -> tuple[str, ...]:
    return tuple(f"self_attn.{name}_proj.{which}" for name in ("q", "k", "v"))


_LAYER = (
    _Row(
        "input_layernorm.weight",
        _h,
        REPLICATED,
        False,
        ("ln_1.weight", False),
        hf_more=_megatron_named("input_layernorm.weight", "input_layernorm.weight"),
    ),
    _Row(
        "input_layernorm.bias",
        _h,
        REPLICATED,
        False,
        ("ln_1.bias", False),
        _norm_bias,
        hf_more=_megatron_named("input_layernorm.bias", None),
    ),
    # GPT-2's c_attn holds [all q | all k | all v] columns: a reordering, not a rename (hf.py).
    _Row(
        "self_attention.query_key_value.weight",
        lambda c: (c.qkv_size, c.hidden_size),
        QKV,
        True,
        hf_more=_megatron_named("self_attention.query_key_value.weight", _llama_qkv("weight")),
    ),
    _Row(
        "self_attention.query_key_value.bias",
        lambda c: (c.qkv_size,),
        QKV,
        False,
        present=_linear_bias,
        hf_more=_megatron_named("self_attention.query_key_value.bias", _llama_qkv("bias")),
    ),
    _Row(
        "self_attention.dense.weight",
        lambda c: (c.hidden_size, c.hidden_size),
        COLUMNS,
        True,
        ("attn.c_proj.weight", True),
        hf_more=_megatron_named("self_attention.dense.weight", "self_attn.o_proj.weight"),
    ),
    _Row(
        "self_attention.dense.bias",
        _h,
        REPLICATED,
        False,
        ("attn.c_proj.bias", False),
        _linear_bias,
        hf_more=_megatron_named("self_attention.dense.bias", "self_attn.o_proj.bias"),
    ),
    _Row(
        "post_attention_layernorm.weight",
        _h,
        REPLICATED,
        False,
        ("ln_2.weight", False),
        hf_more=_megatron_named(
            "post_attention_layernorm.weight", "post_attention_layernorm.weight"
        ),
    ),
    _Row(
        "post_attention_layernorm.bias",
        _h,
        REPLICATED,
        False,
        ("ln_2.bias", False),
        _norm_bias,
        hf_more=_megatron_named("post_attention_layernorm.bias", None),
    ),
    _Row(
        "mlp.dense_h_to_4h.weight",
        lambda c: (_mlp_rows(c), c.hidden_size),
        _mlp_split,
        True,
        ("mlp.c_fc.weight", True),
        hf_more=_megatron_named("mlp.dense_h_to_4h.weight", _llama_pair("mlp.", "weight")),
    ),
    _Row(
        "mlp.dense_h_to_4h.bias",
        lambda c: (_mlp_rows(c),),
        _mlp_split,
        False,
        ("mlp.c_fc.bias", False),
        _linear_bias,
        hf_more=_megatron_named("mlp.dense_h_to_4h.bias", _llama_pair("mlp.", "bias")),
    ),
    _Row(
        "mlp.dense_4h_to_h.weight",
        lambda c: (c.hidden_size, c.ffn_size),
        COLUMNS,
        True,
        ("mlp.c_proj.weight", True),
        hf_more=_megatron_named("mlp.dense_4h_to_h.weight", "mlp.down_proj.weight"),
    ),
    _Row(
        "mlp.dense_4h_to_h.bias",
        _h,
        REPLICATED,
        False,
        ("mlp.c_proj.bias", False),
        _linear_bias,
        hf_more=_megatron_named("mlp.dense_4h_to_h.bias", "mlp.down_proj.bias"),
    ),
)
_FINAL_NORM = (
    _Row(
        "final_layernorm.weight",
        _h,
        REPLICATED,
        False,
        ("transformer.ln_f.weight", False),
        hf_more={
            LLAMA_HF: "model.norm.weight",
            GPT_NEOX_HF: "gpt_neox.final_layer_norm.weight",
            BLOOM_HF: "transformer.ln_f.weight",
        },
    ),
    _Row(
        "final_layernorm.bias",
        _h,
        REPLICATED,
        False,
        ("transformer.ln_f.bias", False),
        _norm_bias,
        hf_more={GPT_NEOX_HF: "gpt_neox.final_layer_norm.bias", BLOOM_HF: "transformer.ln_f.bias"},
    ),
)
# The untied output layer (upstream's --untie-embeddings-and-output-weights): Megatron's
# `language_model.output_layer`, the pipeline's `lm_head` in its own layer file.
_OUTPUT_LAYER = _Row(
    "output_layer.weight",
    lambda c: (c.padded_vocab_size, c.hidden_size),
    VOCAB_ROWS,
    True,
    present=lambda c: c.untie_embeddings_and_output_weights,
    # GPT-NeoX's files call it embed_out (transformers 4's module; 5 saves it so too)
    hf_more={
        LLAMA_HF: "lm_head.weight",
        GPT_NEOX_HF: "embed_out.weight",
        BLOOM_HF: "lm_head.weight",
    },
)


def _param(row: _Row, config: GPTConfig, *, name: str, index: int | None = None) -> Param:
    def prefixed(family: str, local: str | tuple[str, ...]) -> str | tuple[str, ...]:
        prefix = "" if index is None else HF_LAYER_PREFIXES[family].format(index)
        return prefix + local if isinstance(local, str) else tuple(prefix + n for n in local)

    hf_name, transposed = (
        (None, False) if row.hf is None else (prefixed(GPT2_HF, row.hf[0]), row.hf[1])
    )
    return Param(
        name=name,
        shape=row.shape(config),
        split=row.split_for(config),
        decay=row.decay,
        hf_name=hf_name,
        hf_transposed=transposed,
        hf_names=(
            *(() if hf_name is None else ((GPT2_HF, hf_name),)),
            *((family, prefixed(family, local)) for family, local in row.hf_more.items()),
        ),
    )


def embedding_parameters(config: GPTConfig) -> tuple[Param, ...]:
    """The embedding's: word embeddings [+ their norm] [+ learned positions]."""
    rows = [_WORDS]
    if config.embed_layernorm:
        rows += _EMBED_NORM
    if config.learned_positions:
        rows.append(_POSITIONS)
    return tuple(_param(row, config, name=row.local) for row in rows if row.present(config))


def layer_parameters(config: GPTConfig, index: int | None = None) -> tuple[Param, ...]:
    """One transformer layer's, named `layers.{index}.X` (by X alone when `index` is None)."""
    prefix = "" if index is None else f"layers.{index}."
    return tuple(
        _param(row, config, name=prefix + row.local, index=index)
        for row in _LAYER
        if row.present(config)
    )


def final_parameters(config: GPTConfig) -> tuple[Param, ...]:
    """The final norm's."""
    return tuple(_param(row, config, name=row.local) for row in _FINAL_NORM if row.present(config))


def head_parameters(config: GPTConfig) -> tuple[Param, ...]:
    """The untied output layer's; none when the head is the word embeddings (tied)."""
    return tuple(
        _param(row, config, name=row.local) for row in (_OUTPUT_LAYER,) if row.present(config)
    )


def parameters(config: GPTConfig) -> tuple[Param, ...]:
    """Every parameter of the plain GPT, in `GPT.named_parameters()` order (a tied head once)."""
    layers = (p for i in range(config.num_layers) for p in layer_parameters(config, i))
    return (
        *embedding_parameters(config),
        *layers,
        *final_parameters(config),
        *head_parameters(config),
    )


def split_of_local(local: str, config: GPTConfig) -> Split:
    """The split of a parameter by its name inside its part (a layer's, or the embedding's,
    final norm's and output layer's full names) in this config's architecture."""
    for row in (_WORDS, *_EMBED_NORM, _POSITIONS, *_LAYER, *_FINAL_NORM, _OUTPUT_LAYER):
        if row.local == local:
            return row.split_for(config)
    return Split(REPLICATED)


WORD_EMBEDDINGS = _WORDS.local
OUTPUT_LAYER = _OUTPUT_LAYER.local
FINAL_NORM = tuple(row.local for row in _FINAL_NORM)
