"""The GPT's command-line flags, declared once for every mds tool (mds_common.flags): its shape
(`ShapeFlags`, what a checkpoint records and a loader checks), the rest of `GPTConfig`'s
architecture flags (`GPTFlags`: mds-train's and mds-model info's alike) and the parallel layout
(`ParallelFlags`). Spellings and defaults are Megatron-DeepSpeed's `arguments.py`; a field's name is
its argparse dest and `GPTConfig`'s field. `--seq-length` is mds_common.sample_flags' (the data's
sample length too).

Imports neither torch nor the model code: `mds-generate --help` reads these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mds_common.flags import flag, restate
from mds_common.sample_flags import SeqLengthFlags

from .arguments import ARGUMENT_OF, SWIGLU, activation_of
from .config import GPT2, NORMALIZATIONS, POSITION_EMBEDDING_TYPES

# The flag's choices: GPTConfig's, with Megatron's 'absolute' for the learned table beside it.
POSITION_ALIASES = {"absolute": "learned"}
POSITION_TYPES = (POSITION_EMBEDDING_TYPES[0], *POSITION_ALIASES, *POSITION_EMBEDDING_TYPES[1:])
# deepspeedai's switch for rotary positions (its args.use_rotary_position_embeddings).
USE_ROTARY = "--use-rotary-position-embeddings"


def _row_flag(field: str) -> str:
    """Upstream's flag of a GPTConfig field: mds_model.arguments' row, spelled there once."""
    return ARGUMENT_OF[field].flag


def check_at_least(group: Any, minimum: int, *names: str) -> None:
    """Each named field that is set is at least `minimum`; the error names its flag. A size of
    0 would otherwise surface deep in the run (a ZeroDivisionError, DeepSpeed's assertion) or,
    for `--global-batch-size 0`, silently fall back to the default."""
    for name in names:
        value = getattr(group, name)
        if value is not None and value < minimum:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {minimum}, got {value}")


@dataclass(frozen=True, kw_only=True)
class ShapeFlags:
    """The sizes that fix a GPT's parameters. Unset: the tool's default (mds-model info's
    heads are hidden size / 64) or, where a checkpoint is read, the checkpoint's."""

    num_layers: int | None = flag("--num-layers", help="Transformer layers.")
    hidden_size: int | None = flag("--hidden-size", help="Hidden size.")
    num_attention_heads: int | None = flag("--num-attention-heads", help="Attention heads.")
    ffn_hidden_size: int | None = flag(
        "--ffn-hidden-size", help="MLP width.", shown_default="4 x hidden size"
    )
    max_position_embeddings: int | None = flag(
        "--max-position-embeddings",
        help="Learned position table size.",
        shown_default="seq length",
    )

    def __post_init__(self) -> None:
        check_at_least(self, 1, *self.shape_fields())

    @classmethod
    def shape_fields(cls) -> tuple[str, ...]:
        return tuple(ShapeFlags.__dataclass_fields__)

    def given_shape(self) -> tuple[tuple[str, int], ...]:
        """The shape flags given, (GPTConfig field, value): what a loader checks."""
        return tuple(
            (name, getattr(self, name))
            for name in self.shape_fields()
            if getattr(self, name) is not None
        )


@dataclass(frozen=True, kw_only=True)
class GPTFlags(ShapeFlags):
    """Every flag of a GPT to build (mds-train) or size (mds-model info) but its vocabulary."""

    seq_length: int | None = restate(SeqLengthFlags, "seq_length")
    make_vocab_size_divisible_by: int = flag(
        "--make-vocab-size-divisible-by", default=128, help="Vocabulary padding multiple (x TP)."
    )
    pad_vocab_size_to: int | None = flag("--pad-vocab-size-to", help="Pad the vocabulary to this.")
    position_embedding_type: str = flag(
        "--position-embedding-type",
        default="learned",
        choices=POSITION_TYPES,
        help="Positions: learned (Megatron's 'absolute'), rotary or alibi.",
    )
    sequence_parallel: bool = flag(
        "--sequence-parallel", default=False, help="Split norms and dropout along the sequence."
    )
    layernorm_epsilon: float = flag("--layernorm-epsilon", default=1e-5, help="LayerNorm eps.")
    embed_layernorm: bool = flag(
        "--embed-layernorm", default=False, help="LayerNorm after the word embeddings (BLOOM)."
    )
    # The MLP's GeLU, chosen by upstream's flags as its ParallelMLP chooses (`activation`).
    openai_gelu: bool = flag(
        "--openai-gelu", default=False, help="GeLU as OpenAI's tanh approximation."
    )
    onnx_safe: str | None = flag(
        "--onnx-safe",
        help="Exact (erf) GeLU unless --openai-gelu; any non-empty value is true, as upstream's.",
    )
    no_bias_gelu_fusion: bool = flag(
        "--no-bias-gelu-fusion",
        default=False,
        help="Exact (erf) GeLU, upstream's unfused F.gelu; default: its fused tanh bias_gelu.",
    )
    # The Llama family's flags (upstream's examples_deepspeed/pretrain_llama*_distributed.sh);
    # field names are upstream's argparse dests, GPTConfig's fields in `gpt_fields`.
    swiglu: bool = flag(
        SWIGLU.flag,
        default=False,
        help="Gated MLP silu(gate) * up (dense_h_to_4h [gate; up]); wins over the GeLU flags.",
    )
    normalization: str = flag(
        _row_flag("normalization"),
        default=GPT2["normalization"],
        choices=NORMALIZATIONS,
        help="The layers' and final norm: LayerNorm, or RMSNorm (a weight, no bias; fp32).",
    )
    add_bias_linear: bool = flag(
        _row_flag("add_bias_linear"),
        default=True,
        negates=True,
        help="No biases on QKV, attention dense and the two MLP linears (the norms keep theirs).",
    )
    untie_embeddings_and_output_weights: bool = flag(
        _row_flag("untie_embeddings_and_output_weights"),
        default=False,
        help="An output layer of its own instead of the word embeddings as the LM head.",
    )
    num_key_value_heads: int | None = flag(
        _row_flag("num_query_groups"),
        help="Key/value heads (grouped-query attention); must divide the attention heads.",
        shown_default="num attention heads",
    )
    use_rotary_position_embeddings: bool = flag(
        USE_ROTARY,
        default=False,
        help="Rotary positions (rotate-half), no position table: --position-embedding-type rotary.",
    )
    rotary_percent: float = flag(
        _row_flag("rotary_percent"),
        default=GPT2["rotary_percent"],
        help="Rotate the first int(head dim x this) dimensions of each head (rotary positions).",
    )
    # An integer, as upstream's argparse reads it (type=int).
    rope_theta: int = flag(
        _row_flag("rotary_base"),
        default=int(GPT2["rotary_base"]),
        help="Rotary base theta (an integer, as upstream's).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_at_least(self, 1, "seq_length", "make_vocab_size_divisible_by", "pad_vocab_size_to")
        check_at_least(self, 1, "num_key_value_heads", "rope_theta")
        heads, groups = self.num_attention_heads, self.num_key_value_heads
        if heads is not None and groups is not None and heads % groups:
            raise ValueError(  # upstream's validate_args asserts the same
                f"--num-attention-heads ({heads}) must be divisible by "
                f"{_row_flag('num_query_groups')} ({groups})"
            )
        if not 0.0 < self.rotary_percent <= 1.0:
            raise ValueError(
                f"{_row_flag('rotary_percent')} must be in (0, 1], got {self.rotary_percent}"
            )
        position = POSITION_ALIASES.get(self.position_embedding_type, self.position_embedding_type)
        if self.use_rotary_position_embeddings and position not in ("learned", "rotary"):
            raise ValueError(
                f"{USE_ROTARY} and --position-embedding-type {self.position_embedding_type} name "
                "two position embeddings: give one"
            )

    @property
    def position(self) -> str:
        """GPTConfig.position_embedding_type: rotary under --use-rotary-position-embeddings (as
        upstream, which then adds no position table), else --position-embedding-type's."""
        if self.use_rotary_position_embeddings:
            return "rotary"
        return POSITION_ALIASES.get(self.position_embedding_type, self.position_embedding_type)

    @property
    def activation(self) -> str:
        """GPTConfig.activation as upstream's ParallelMLP picks it from these flags
        (mds_model.arguments.activation_of)."""
        return activation_of(
            openai_gelu=self.openai_gelu,
            onnx_safe=self.onnx_safe,
            bias_gelu_fusion=not self.no_bias_gelu_fusion,
            swiglu=self.swiglu,
        )

    def gpt_fields(self) -> dict[str, Any]:
        """These flags as GPTConfig's keyword arguments (unset sizes left to GPTConfig)."""
        fields = {
            name: getattr(self, name)
            for name in (
                *self.shape_fields(),
                "seq_length",
                "make_vocab_size_divisible_by",
                "pad_vocab_size_to",
                "sequence_parallel",
                "layernorm_epsilon",
                "embed_layernorm",
                "normalization",
                "add_bias_linear",
                "untie_embeddings_and_output_weights",
                "rotary_percent",
            )
            if getattr(self, name) is not None
        }
        fields["num_query_groups"] = self.num_key_value_heads
        fields["rotary_base"] = ARGUMENT_OF["rotary_base"].read(self.rope_theta)
        fields["position_embedding_type"] = self.position
        fields["activation"] = self.activation
        return fields


@dataclass(frozen=True, kw_only=True)
class ParallelFlags:
    """The parallel layout: world = PP x DP x TP ranks."""

    tensor_model_parallel_size: int = flag(
        "--tensor-model-parallel-size", default=1, help="Tensor-parallel ranks (TP)."
    )
    pipeline_model_parallel_size: int = flag(
        "--pipeline-model-parallel-size", default=1, help="Pipeline stages (PP)."
    )
    zero_stage: int = flag("--zero-stage", default=0, help="ZeRO stage 0-3 (PP > 1: 0 or 1).")


@dataclass(frozen=True, kw_only=True)
class MicroBatchFlags:
    micro_batch_size: int = flag(
        "--micro-batch-size", default=1, help="Sequences per micro-batch per GPU."
    )


@dataclass(frozen=True, kw_only=True)
class HalfFlags:
    """Megatron's half-precision switches (mds-train trains in them, mds-generate runs in them)."""

    fp16: bool = flag("--fp16", default=False, help="float16 weights and activations.")
    bf16: bool = flag("--bf16", default=False, help="bfloat16 weights and activations.")


@dataclass(frozen=True, kw_only=True)
class Fp8Flags:
    """Upstream's Transformer-Engine FP8 flags (megatron/arguments.py), read as its DelayedScaling
    recipe (mds_model.fp8.recipe): the format, then how the scales follow the amaxes."""

    fp8_e4m3: bool = flag("--fp8-e4m3", default=False, help="FP8 linears, E4M3 throughout.")
    fp8_hybrid: bool = flag(
        "--fp8-hybrid", default=False, help="FP8 linears: E4M3 forward, E5M2 gradients."
    )
    fp8_wgrad: bool = flag(
        "--no-fp8-wgrad",
        default=True,
        negates=True,
        help="Weight gradients in 16 bits, not FP8.",
    )
    fp8_margin: int = flag("--fp8-margin", default=0, help="FP8 scale margin (powers of 2).")
    fp8_interval: int = flag(
        "--fp8-interval", default=1, help="Iterations between FP8 scale updates."
    )
    fp8_amax_history_len: int = flag(
        "--fp8-amax-history-len", default=1, help="Iterations of amax history per FP8 tensor."
    )
    fp8_amax_compute_algo: str = flag(
        "--fp8-amax-compute-algo",
        default="most_recent",
        choices=("most_recent", "max"),
        help="Amax of the history the scale follows.",
    )

    def __post_init__(self) -> None:
        if self.fp8_e4m3 and self.fp8_hybrid:  # upstream's validate_args asserts it too
            raise ValueError("give --fp8-e4m3 or --fp8-hybrid, not both")
        self.fp8_recipe()  # the recipe's own checks, naming the flags

    def fp8_recipe(self):  # -> mds_model.fp8.Fp8Recipe | None (imported here: no torch above)
        """The recipe the flags select, or None without --fp8-e4m3/--fp8-hybrid."""
        from .fp8.recipe import Fp8Recipe

        fmt = "e4m3" if self.fp8_e4m3 else "hybrid" if self.fp8_hybrid else None
        recipe = Fp8Recipe(
            fmt=fmt or "hybrid",
            margin=self.fp8_margin,
            interval=self.fp8_interval,
            amax_history_len=self.fp8_amax_history_len,
            amax_compute_algo=self.fp8_amax_compute_algo,
            fp8_wgrad=self.fp8_wgrad,
        )
        return recipe if fmt else None
