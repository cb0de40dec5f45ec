"""One tokenizer interface for every mds tool, chosen by Megatron's flags: `--tokenizer-type
GPT2BPETokenizer --vocab-file V --merge-file M` (GPT-2's files or a learned vocabulary),
`--tokenizer-type PretrainedFromHF --tokenizer-name-or-path X` (a Hugging Face `tokenizer.json`),
or deepspeedai/Megatron-DeepSpeed's `--tokenizer-type SentencePieceTokenizer|
GPTSentencePieceTokenizer|HFTokenizer --tokenizer-model X` (a SentencePiece model, a
tokenizer.json).

`load_tokenizer(TokenizerSpec(...))` returns an object with the `Tokenizer` protocol below; its
`record()` (an `mds_common.tokenizer_record.TokenizerRecord`) is what dataset sidecars
(`vocabulary`) and checkpoints (`tokenizer`) record, and `check_tokenizer_matches` is the one-line
refusal of a dataset made by another tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from mds_common.tokenizer_record import (
    GPT2_BPE,
    GPT_SENTENCEPIECE,
    HF_TOKENIZER,
    PRETRAINED_FROM_HF,
    SENTENCEPIECE,
    TokenizerRecord,
)

if TYPE_CHECKING:  # the command line imports this module and starts without numpy
    import numpy as np

# upstream's types that read --tokenizer-model
MODEL_TYPES = (SENTENCEPIECE, GPT_SENTENCEPIECE, HF_TOKENIZER)
TOKENIZER_TYPES = (GPT2_BPE, PRETRAINED_FROM_HF, *MODEL_TYPES)
FLAG = "--tokenizer-name-or-path"
MODEL_FLAG = "--tokenizer-model"


@runtime_checkable
class Tokenizer(Protocol):
    """What every tool may rely on, whichever tokenizer made the ids."""

    vocab_size: int  # unpadded: Megatron's `tokenizer.vocab_size`, what the .bin dtype follows
    max_token_id: int

    @property
    def eod(self) -> int:
        """The end-of-document id; ValueError (saying how to name one) when there is none."""

    @property
    def has_eod(self) -> bool: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids) -> str:
        """Text of ids; ValueError for an id outside the vocabulary."""

    def encode_batch(
        self, texts: list[str], *, append_eod: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids back to back, one length per text); an empty result gets length 0 and no EOD."""

    def record(self) -> TokenizerRecord:
        """`type`, the files and their SHA-256, `vocab_size`, `eod_id` (`to_json()` writes it)."""

    @property
    def files(self) -> tuple[Path, ...]:
        """The files the tokenizer was read from (a sidecar's `inputs`)."""


def pack_id_lists(id_lists: list[list[int]], *, eod: int | None) -> tuple[np.ndarray, np.ndarray]:
    """`encode_batch`'s result from one id list per text: with `eod`, it ends each non-empty
    list (Megatron appends none to an empty document); the ids back to back as uint32 and the
    lengths as int64. The lists are extended in place."""
    import itertools

    import numpy as np

    if eod is not None:
        for ids in id_lists:
            if ids:
                ids.append(eod)
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    ids = np.fromiter(
        itertools.chain.from_iterable(id_lists), dtype=np.uint32, count=int(lengths.sum())
    )
    return ids, lengths


class TokenizerFlagError(ValueError):
    """A tokenizer flag missing, or given where it does not apply (a usage error)."""


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """The tokenizer flags of any tool, validated; errors name the flag."""

    tokenizer_type: str = GPT2_BPE
    vocab_file: Path | None = None
    merge_file: Path | None = None
    tokenizer_name_or_path: str | None = None
    eod_token: str | None = None
    tokenizer_model: str | None = None

    def __post_init__(self):
        if self.tokenizer_type not in TOKENIZER_TYPES:
            raise TokenizerFlagError(
                f"--tokenizer-type {self.tokenizer_type}: choose {GPT2_BPE} (--vocab-file, "
                f"--merge-file), {PRETRAINED_FROM_HF} ({FLAG}: any Hugging Face tokenizer.json, "
                f"BERT WordPiece and SentencePiece ones included), or {', '.join(MODEL_TYPES)} "
                f"({MODEL_FLAG})"
            )
        gpt2_flags = {"--vocab-file": self.vocab_file, "--merge-file": self.merge_file}
        hf_flags = {FLAG: self.tokenizer_name_or_path, "--eod-token": self.eod_token}
        model_flags = {MODEL_FLAG: self.tokenizer_model}
        kind = self.tokenizer_type
        if kind == GPT2_BPE:
            needed, owners = gpt2_flags, {**hf_flags, **model_flags}
            why = "reads GPT-2's vocab.json and merges.txt (or a learned pair)"
            remedy = f"add --tokenizer-type {PRETRAINED_FROM_HF} to use a Hugging Face tokenizer"
        elif kind == PRETRAINED_FROM_HF:
            needed, owners = {FLAG: self.tokenizer_name_or_path}, {**gpt2_flags, **model_flags}
            why = "needs a folder holding tokenizer.json, the file itself, or a hub name"
            remedy = f"drop it ({PRETRAINED_FROM_HF} reads {FLAG} and --eod-token)"
        else:
            needed, owners = model_flags, {**gpt2_flags, **hf_flags}
            why = (
                "needs a folder holding tokenizer.json, the file itself, or a hub name"
                if kind == HF_TOKENIZER
                else "needs the SentencePiece model file (tokenizer.model)"
            )
            remedy = f"drop it ({kind} reads {MODEL_FLAG} alone, as upstream)"
        for flag, value in owners.items():
            if value is not None:
                other = (
                    GPT2_BPE
                    if flag in gpt2_flags
                    else PRETRAINED_FROM_HF
                    if flag in hf_flags
                    else "|".join(MODEL_TYPES)
                )
                if kind == GPT2_BPE and flag == MODEL_FLAG:  # the type left at its default
                    remedy = f"add --tokenizer-type {', '.join(MODEL_TYPES[:2])} or {HF_TOKENIZER}"
                    remedy += ", as upstream"
                raise TokenizerFlagError(
                    f"{flag} is for --tokenizer-type {other}, not {kind}; {remedy}"
                )
        for flag, value in needed.items():
            if not value:
                raise TokenizerFlagError(
                    f"Missing option '{flag}': --tokenizer-type {self.tokenizer_type} {why}"
                )
        if self.eod_token == "":
            raise TokenizerFlagError("--eod-token: give the token's text, e.g. --eod-token '</s>'")
        if self.tokenizer_type == GPT2_BPE:
            for flag, path in gpt2_flags.items():
                if not Path(path).is_file():
                    raise ValueError(f"{flag}: {path} is not a file; pass the GPT-2 tokenizer file")


def load_tokenizer(spec: TokenizerSpec | None = None, **flags) -> Tokenizer:
    """The tokenizer the flags name: `load_tokenizer(spec)` or `load_tokenizer(tokenizer_type=...,
    vocab_file=..., merge_file=..., tokenizer_name_or_path=..., eod_token=...)`.

    Raises ValueError naming the flag or file for a user mistake (TokenizerFlagError for flags).
    """
    if spec is None:
        spec = TokenizerSpec(**flags)
    elif flags:
        raise TypeError("pass a TokenizerSpec or flags, not both")
    if spec.tokenizer_type == GPT2_BPE:
        from mds_tokenize.tokenizer import GPT2BPETokenizer

        return GPT2BPETokenizer.from_files(spec.vocab_file, spec.merge_file)
    if spec.tokenizer_type in (SENTENCEPIECE, GPT_SENTENCEPIECE):
        from mds_tokenize.sentencepiece_tokenizer import SentencePieceTokenizer

        return SentencePieceTokenizer.from_file(spec.tokenizer_model, kind=spec.tokenizer_type)
    from mds_tokenize.hf_tokenizer import HFTokenizer

    if spec.tokenizer_type == HF_TOKENIZER:
        return HFTokenizer.from_name_or_path(spec.tokenizer_model, kind=HF_TOKENIZER)
    return HFTokenizer.from_name_or_path(spec.tokenizer_name_or_path, eod_token=spec.eod_token)


def spec_from_record(record: TokenizerRecord) -> TokenizerSpec:
    """The flags that reload a recorded tokenizer (a sidecar's `vocabulary`, meta.json's
    `tokenizer`), from the files it names; ValueError when it names none."""
    if record.kind in MODEL_TYPES:
        source = record.tokenizer_file or record.name_or_path
        if not source:
            raise ValueError(f"the recorded {record.kind} names no {MODEL_FLAG} file")
        return TokenizerSpec(tokenizer_type=record.kind, tokenizer_model=str(source))
    if record.kind == PRETRAINED_FROM_HF:
        source = record.tokenizer_file or record.name_or_path
        if not source:
            raise ValueError("the recorded tokenizer names no tokenizer.json or hub name")
        return TokenizerSpec(
            tokenizer_type=PRETRAINED_FROM_HF,
            tokenizer_name_or_path=str(source),
            eod_token=record.eod_token,
        )
    if record.vocab_file is None or record.merge_file is None:
        raise ValueError("the recorded tokenizer names no vocab and merge files")
    return TokenizerSpec(
        tokenizer_type=GPT2_BPE,
        vocab_file=Path(record.vocab_file),
        merge_file=Path(record.merge_file),
    )


def check_tokenizer_matches(
    recorded: TokenizerRecord | None, given: TokenizerRecord, *, source: str
) -> None:
    """ValueError in one line when `recorded` (a dataset's tokenizer; None when it records none) is
    not `given` (a `Tokenizer.record()`): `TokenizerRecord.same_as`."""
    if recorded is not None:
        _check_same_tokenizer(
            recorded,
            given,
            made=f"{source} was tokenized with",
            remedy="pass the tokenizer it was made with (its .tokenize.json records it) or "
            "re-tokenize it",
        )


def check_checkpoint_tokenizer(
    recorded: TokenizerRecord,
    given: TokenizerRecord,
    *,
    checkpoint: str,
    model_rows: int | None = None,
    change_flag: str | None = None,
    change_allowed: bool = False,
) -> None:
    """The one check of every tool where a checkpoint meets the tokenizer its flags name
    (mds-train's --load and --universal-checkpoint, mds-generate, mds-merge-mp export-hf):
    ValueError in one line unless `given` (a `Tokenizer.record()`) is the tokenizer `recorded`
    (meta.json's `tokenizer`) names, by what it records: the same end-of-document id, the same
    files by content (`TokenizerRecord.same_as`), the same number of ids. `model_rows`: the
    embedding rows the checkpoint holds, which every id of `given` must have. `change_flag`: the
    tool's flag that says a change is meant (named in the message); with `change_allowed` only
    the rows must fit. A record of Megatron's args (paths only, often of another machine) is
    compared by content where its files are here, else by kind and the rows alone."""
    rows = None if given.vocab_size is None else given.embedding_rows()
    if None not in (model_rows, rows) and rows > model_rows:
        raise ValueError(
            f"{checkpoint}: the model has {model_rows} embedding rows, but the tokenizer flags "
            f"name {given.label()} with {rows} ids; pass the tokenizer it was trained with "
            "(its meta.json records it)"
        )
    if change_allowed:
        return
    difference = _difference(recorded, given, rows)
    if difference is None:
        return
    allow = f", or add {change_flag} if the change is meant" if change_flag else ""
    raise ValueError(
        f"{checkpoint}: the model was trained with {recorded.label()}, but the tokenizer flags "
        f"name {given.label()}: {difference}; pass the tokenizer it was trained with (its "
        f"meta.json records it){allow}"
    )


def _difference(recorded: TokenizerRecord, given: TokenizerRecord, rows: int | None) -> str | None:
    """How `given` differs from `recorded`, in a few words, by what `recorded` can tell: mds
    records the files' contents (SHA-256) and the ids trained; Megatron's args (read by
    mds-checkpoint) name only files, often of another machine, and a size that may be the padded
    one, so those are compared by content only where the files are here."""
    if None not in (recorded.eod_id, given.eod_id) and recorded.eod_id != given.eod_id:
        return f"end of document is id {given.eod_id}, the checkpoint's was {recorded.eod_id}"
    if not recorded.names_tokenizer:
        return None
    if recorded.kind != given.kind:
        return "another kind of tokenizer"
    hashed = recorded.records_contents
    if (hashed or recorded.files_at_hand) and not recorded.same_as(given):
        return "token ids mean different things"
    if hashed and None not in (recorded.vocab_size, rows) and recorded.vocab_size != rows:
        return f"{rows} ids where the model was trained with {recorded.vocab_size}"
    return None


def _check_same_tokenizer(
    recorded: TokenizerRecord, given: TokenizerRecord, *, made: str, remedy: str
) -> None:
    if not recorded.same_as(given):
        raise ValueError(
            f"{made} {recorded.label()}, but the tokenizer flags name "
            f"{given.label()}: token ids mean different things; {remedy}"
        )


def check_dataset_tokenizer(prefix: str | Path, given: TokenizerRecord) -> None:
    """`check_tokenizer_matches` against the tokenizer a dataset's sidecar records (datasets
    without a sidecar, e.g. made by Megatron, are not checked)."""
    from mds_indexed_data.vocabulary import recorded_vocabulary

    check_tokenizer_matches(recorded_vocabulary(prefix), given, source=str(prefix))
