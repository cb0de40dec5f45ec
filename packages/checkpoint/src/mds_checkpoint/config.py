"""What each `mds-merge-mp` command is asked to do, as frozen dataclasses checked on creation:
each field is a flag (mds_common.flags), the command's options are generated from them.

The flag groups are declared once by their owners (`mds_checkpoint.flags`: --load, --save, the
target layout and the checked model flags; `mds_model.flags`: the GPT's; `mds_tokenize.flags`:
the tokenizer's). Errors name the command-line flag, so the CLI passes them through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mds_common.flags import flag, restate
from mds_model.flags import GPTFlags, ParallelFlags, check_at_least
from mds_tokenize.flags import TokenizerFlags, named_tokenizer_spec
from mds_tokenize.interface import TokenizerSpec

from .flags import CheckedShapeFlags, LoadFlags, SaveFlags, TargetParallelFlags, checked

TARGET_LAYOUTS = ("mds", "deepspeedai", "bigscience", "megatron")  # writer.py describes them


def _distinct(load: Path, save: Path) -> None:
    if save.resolve() == load.resolve():
        raise ValueError(f"--save {save} is the --load folder; write the result elsewhere")


# A config's bases are listed last group first: dataclasses order fields from the last base, and
# that order is --help's.


@dataclass(frozen=True, kw_only=True)
class VerifyFlags:
    verify: bool = flag(
        "--verify",
        default=False,
        help="Run source and output on 2 x 32 seeded random token ids on CPU; print the largest "
        "logit difference and the loss on those ids (random ids, not text: no validation loss).",
    )


@dataclass(frozen=True, kw_only=True)
class ReshapeConfig(VerifyFlags, TargetParallelFlags, SaveFlags, LoadFlags):
    """`mds-merge-mp --load DIR --save OUT --target-tensor-model-parallel-size T ...`."""

    with_optimizer: bool = flag(
        "--with-optimizer",
        default=False,
        help="Also reshape fp32 master weights and Adam moments (any DP size) so that "
        "mds-train --load resumes at the new layout.",
    )
    # A plain string, not choices: another name gets the message below (exit 1).
    target_layout: str = flag(
        "--target-layout",
        default="mds",
        help="Files to write: mds (mds-train's), deepspeedai or bigscience (Megatron-DeepSpeed "
        "forks' DeepSpeed files), megatron (iter_N/mp_rank_XX/model_optim_rng.pt).",
    )

    def __post_init__(self) -> None:
        TargetParallelFlags.__post_init__(self)
        LoadFlags.__post_init__(self)
        if self.target_layout not in TARGET_LAYOUTS:
            raise ValueError(
                f"--target-layout {self.target_layout}: choose one of {', '.join(TARGET_LAYOUTS)}"
            )
        if self.with_optimizer and self.target_layout != "mds":
            raise ValueError(
                f"--with-optimizer writes mds-train's universal optimizer layout; --target-layout "
                f"{self.target_layout} takes the weights only (drop one of the two)"
            )
        _distinct(self.load, self.save)


_SOURCE = "The source's (merge_mp_partitions' flag); checked against the files."


@dataclass(frozen=True, kw_only=True)
class SourceLayout:
    model_type: str = flag(
        "--model-type", default="GPT", help="merge_mp_partitions' flag; only GPT."
    )
    tensor_model_parallel_size: int | None = restate(
        ParallelFlags, "tensor_model_parallel_size", default=None, note=_SOURCE
    )
    pipeline_model_parallel_size: int | None = restate(
        ParallelFlags, "pipeline_model_parallel_size", default=None, note=_SOURCE
    )


@dataclass(frozen=True, kw_only=True)
class SourceChecks(CheckedShapeFlags, SourceLayout):
    """What merge_mp_partitions' line says of the source, checked against the checkpoint."""

    seq_length: int | None = checked(GPTFlags, "seq_length")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model_type.upper() != "GPT":
            raise ValueError(f"--model-type {self.model_type}: only GPT checkpoints are reshaped")

    def given_model(self) -> tuple[tuple[str, int], ...]:
        """The model flags given, (GPTConfig field, value)."""
        given = self.given_shape()
        return given if self.seq_length is None else (*given, ("seq_length", self.seq_length))


_EXPORTED = "Put beside the export (with its pair) instead of the checkpoint's."


@dataclass(frozen=True, kw_only=True)
class ExportConfig(VerifyFlags, SaveFlags, LoadFlags):
    """`mds-merge-mp export-hf --load DIR --save HFDIR`."""

    save: Path = restate(SaveFlags, "save", note="A Hugging Face folder.")
    eos_token_id: int | None = flag(
        "--eos-token-id",
        help="BOS/EOS id of config.json.",
        shown_default="the checkpoint tokenizer's end of document",
    )
    vocab_file: Path | None = restate(TokenizerFlags, "vocab_file", note=_EXPORTED)
    merge_file: Path | None = restate(TokenizerFlags, "merge_file", note=_EXPORTED)

    def __post_init__(self) -> None:
        LoadFlags.__post_init__(self)
        _distinct(self.load, self.save)
        if (self.vocab_file is None) != (self.merge_file is None):
            given = "--vocab-file" if self.merge_file is None else "--merge-file"
            raise ValueError(f"{given} needs its pair: give both --vocab-file and --merge-file")
        for name, path in (("--vocab-file", self.vocab_file), ("--merge-file", self.merge_file)):
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {path}: no such file")


@dataclass(frozen=True, kw_only=True)
class HFFolderFlags:
    # Not LoadFlags' --load: a Hugging Face folder, no mds checkpoint and no --iteration.
    load: Path = flag(
        "--load",
        required=True,
        help="Hugging Face GPT-2, Llama, GPT-NeoX or BLOOM folder (config.json, safetensors).",
    )


@dataclass(frozen=True, kw_only=True)
class ImportConfig(TokenizerFlags, TargetParallelFlags, SaveFlags, HFFolderFlags):
    """`mds-merge-mp import-hf --load HFDIR --save OUT --target-tensor-model-parallel-size T`,
    with upstream's converter's tokenizer flags (tools/hf2megads_weight_converter.py reads the
    script's `--tokenizer-type HFTokenizer --tokenizer-model $HF_LLAMA_PATH`)."""

    make_vocab_size_divisible_by: int = restate(GPTFlags, "make_vocab_size_divisible_by")
    seq_length: int | None = restate(GPTFlags, "seq_length", shown_default="n_positions")
    # Unset (with no files named): the folder's own tokenizer, recorded as PretrainedFromHF.
    tokenizer_type: str | None = restate(
        TokenizerFlags,
        "tokenizer_type",
        default=None,
        shown_default="the folder's own tokenizer",
        note="The tokenizer meta.json records, as the run that loads the import names it.",
    )

    def __post_init__(self) -> None:
        TargetParallelFlags.__post_init__(self)
        check_at_least(self, 1, "make_vocab_size_divisible_by", "seq_length")
        _distinct(self.load, self.save)

    def tokenizer(self) -> TokenizerSpec | None:
        """The tokenizer the flags name; None when they name none (the folder's own is recorded).
        A missing or misplaced flag is a usage error (exit 2), as in every mds tool."""
        if self.tokenizer_type is None and not self.names_files:
            return None
        return named_tokenizer_spec(self)
