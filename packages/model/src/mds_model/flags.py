"""The GPT's command-line flags, declared once for every mds tool (mds_common.flags): its shape
(`ShapeFlags`, what a checkpoint records and a loader checks), the rest of `GPTConfig`'s flags
(`GPTFlags`) and the parallel layout (`ParallelFlags`). Spellings and defaults are
Megatron-DeepSpeed's `arguments.py`; a field's name is its argparse dest and `GPTConfig`'s field.
`--seq-length` is mds_common.sample_flags' (the data's sample length too).

Imports neither torch nor the model code: `mds-generate --help` reads these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mds_common.flags import flag, restate
from mds_common.sample_flags import SeqLengthFlags

# Megatron's 'absolute' is the learned table; rotary and alibi as upstream.
POSITION_TYPES = ("learned", "absolute", "rotary", "alibi")


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

    def __post_init__(self) -> None:
        super().__post_init__()
        check_at_least(self, 1, "seq_length", "make_vocab_size_divisible_by", "pad_vocab_size_to")

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
            )
            if getattr(self, name) is not None
        }
        position = self.position_embedding_type
        fields["position_embedding_type"] = "learned" if position == "absolute" else position
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
