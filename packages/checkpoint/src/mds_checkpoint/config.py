"""What each `mds-merge-mp` command is asked to do, as frozen dataclasses checked on creation.

Errors name the command-line flag, so the CLI passes them through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TARGET_LAYOUTS = ("mds", "deepspeedai", "bigscience", "megatron")  # writer.py describes them


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
    layout: str = "mds"  # --target-layout: mds, deepspeedai, bigscience or megatron

    def __post_init__(self) -> None:
        _positive(self.tensor_parallel, "--target-tensor-model-parallel-size")
        _positive(self.pipeline_parallel, "--target-pipeline-model-parallel-size")
        if self.iteration is not None and self.iteration < 0:
            raise ValueError(f"--iteration must be >= 0, got {self.iteration}")
        if self.layout not in TARGET_LAYOUTS:
            raise ValueError(
                f"--target-layout {self.layout}: choose one of {', '.join(TARGET_LAYOUTS)}"
            )
        if self.with_optimizer and self.layout != "mds":
            raise ValueError(
                f"--with-optimizer writes mds-train's universal optimizer layout; --target-layout "
                f"{self.layout} takes the weights only (drop one of the two)"
            )
        _distinct(self.load, self.save)


@dataclass(frozen=True)
class ExportConfig:
    """`mds-merge-mp export-hf --load DIR --save HFDIR`."""

    load: Path
    save: Path
    iteration: int | None = None
    eos_token_id: int | None = None  # None: the checkpoint's tokenizer end-of-document id
    verify: bool = False
    vocab_file: Path | None = None  # GPT-2 BPE files to put beside; None: the checkpoint's
    merge_file: Path | None = None

    def __post_init__(self) -> None:
        _distinct(self.load, self.save)
        if (self.vocab_file is None) != (self.merge_file is None):
            given = "--vocab-file" if self.merge_file is None else "--merge-file"
            raise ValueError(f"{given} needs its pair: give both --vocab-file and --merge-file")
        for flag, path in (("--vocab-file", self.vocab_file), ("--merge-file", self.merge_file)):
            if path is not None and not path.is_file():
                raise ValueError(f"{flag} {path}: no such file")


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
