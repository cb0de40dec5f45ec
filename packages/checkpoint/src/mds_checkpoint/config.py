"""What each `mds-merge-mp` command is asked to do, as frozen dataclasses checked on creation.

Errors name the command-line flag, so the CLI passes them through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def _positive(value: int, flag: str) -> None:
    if value < 1:
        raise ValueError(f"{flag} must be a positive integer, got {value}")


def _distinct(load: Path, save: Path) -> None:
    if save.resolve() == load.resolve():
        raise ValueError(f"--save {save} is the --load folder; write the result elsewhere")


@dataclass(frozen=True)
class ReshapeConfig:
    """`mds-merge-mp --load DIR --save OUT --target-tensor-model-parallel-size T ...`."""

    load: Path
    save: Path
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    iteration: int | None = None
    with_optimizer: bool = False
    verify: bool = False

    def __post_init__(self) -> None:
        _positive(self.tensor_parallel, "--target-tensor-model-parallel-size")
        _positive(self.pipeline_parallel, "--target-pipeline-model-parallel-size")
        if self.iteration is not None and self.iteration < 0:
            raise ValueError(f"--iteration must be >= 0, got {self.iteration}")
        _distinct(self.load, self.save)


@dataclass(frozen=True)
class ExportConfig:
    """`mds-merge-mp export-hf --load DIR --save HFDIR`."""

    load: Path
    save: Path
    iteration: int | None = None
    eos_token_id: int | None = None  # None: the checkpoint's tokenizer end-of-document id
    verify: bool = False

    def __post_init__(self) -> None:
        _distinct(self.load, self.save)


@dataclass(frozen=True)
class ImportConfig:
    """`mds-merge-mp import-hf --load HFDIR --save OUT --target-tensor-model-parallel-size T`."""

    load: Path
    save: Path
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    make_vocab_size_divisible_by: int = 128
    seq_length: int | None = None  # None: n_positions

    def __post_init__(self) -> None:
        _positive(self.tensor_parallel, "--target-tensor-model-parallel-size")
        _positive(self.pipeline_parallel, "--target-pipeline-model-parallel-size")
        _positive(self.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by")
        if self.seq_length is not None:
            _positive(self.seq_length, "--seq-length")
        _distinct(self.load, self.save)
