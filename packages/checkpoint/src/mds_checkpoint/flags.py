"""The checkpoint flags, declared once for every mds tool that reads or writes a checkpoint
(mds_common.flags): `--load` and `--iteration`, the Megatron model flags a script also passes,
which a loader checks against the checkpoint (`check_model_flags`: the checkpoint says its shape),
`--save` for a new folder, and the layout mds-merge-mp writes (`--target-...-parallel-size`).

Imports neither torch nor the readers: the tools' `--help` reads these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mds_common.flags import flag, restate
from mds_model.flags import ShapeFlags, check_at_least

_CHECKED = "Checked against the checkpoint, if given."


def checked(group: type, name: str):
    """The flag `name` of `group`, checked against the checkpoint read: unset, the checkpoint's
    value (so no `[default: ...]` of the group's own)."""
    return restate(group, name, note=_CHECKED, shown_default=None)


@dataclass(frozen=True, kw_only=True)
class LoadFlags:
    load: Path = flag(
        "--load",
        required=True,
        help="A save folder (with `latest`) or one checkpoint folder (global_stepN, iter_N), "
        "of any TP/PP layout.",
    )
    iteration: int | None = flag(
        "--iteration", help="Read global_stepN / iter_N of the save folder instead of the newest."
    )

    def __post_init__(self) -> None:
        if self.iteration is not None and self.iteration < 0:
            raise ValueError(f"--iteration must be >= 0, got {self.iteration}")


@dataclass(frozen=True, kw_only=True)
class CheckedShapeFlags(ShapeFlags):
    """The GPT shape flags (mds_model.flags), each checked against the checkpoint read."""

    num_layers: int | None = checked(ShapeFlags, "num_layers")
    hidden_size: int | None = checked(ShapeFlags, "hidden_size")
    num_attention_heads: int | None = checked(ShapeFlags, "num_attention_heads")
    # Unset, these are the checkpoint's, not 4 x hidden size and the sequence length.
    ffn_hidden_size: int | None = checked(ShapeFlags, "ffn_hidden_size")
    max_position_embeddings: int | None = checked(ShapeFlags, "max_position_embeddings")


@dataclass(frozen=True, kw_only=True)
class SaveFlags:
    save: Path = flag("--save", required=True, help="Output folder (created; must not exist).")


@dataclass(frozen=True, kw_only=True)
class TargetParallelFlags:
    """The layout a checkpoint is written at (mds-merge-mp): mds_model.flags' ParallelFlags, of
    the output."""

    target_tensor_model_parallel_size: int = flag(
        "--target-tensor-model-parallel-size", default=1, help="Tensor-parallel size of the output."
    )
    target_pipeline_model_parallel_size: int = flag(
        "--target-pipeline-model-parallel-size",
        default=1,
        help="Pipeline stages of the output (must divide --num-layers).",
    )

    def __post_init__(self) -> None:
        check_at_least(
            self, 1, "target_tensor_model_parallel_size", "target_pipeline_model_parallel_size"
        )
