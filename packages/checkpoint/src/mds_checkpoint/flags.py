"""The checkpoint-loading flags, declared once for every mds tool that reads a checkpoint
(mds_common.flags): `--load` and `--iteration`, and the Megatron model flags a script also passes,
which a loader checks against the checkpoint (`check_model_flags`): the checkpoint says its shape.

Imports neither torch nor the readers: the tools' `--help` reads these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mds_common.flags import flag, restate
from mds_model.flags import ShapeFlags

_CHECKED = "Checked against the checkpoint, if given."


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

    num_layers: int | None = restate(ShapeFlags, "num_layers", note=_CHECKED)
    hidden_size: int | None = restate(ShapeFlags, "hidden_size", note=_CHECKED)
    num_attention_heads: int | None = restate(ShapeFlags, "num_attention_heads", note=_CHECKED)
    # Unset, these are the checkpoint's, not 4 x hidden size and the sequence length.
    ffn_hidden_size: int | None = restate(
        ShapeFlags, "ffn_hidden_size", note=_CHECKED, shown_default=None
    )
    max_position_embeddings: int | None = restate(
        ShapeFlags, "max_position_embeddings", note=_CHECKED, shown_default=None
    )
