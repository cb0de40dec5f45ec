"""Which tokenizer made a dataset's ids or a model's vocabulary, as every tool records and compares
it: a dataset sidecar's `vocabulary`, a checkpoint meta.json's `tokenizer` (README:
"mds_common.tokenizer_record"). GPT-2 BPE files (`vocab_file` + `merge_file`), a Hugging Face
`tokenizer.json` (`type` PretrainedFromHF, or upstream's HFTokenizer) or a SentencePiece model
(`type` SentencePieceTokenizer or GPTSentencePieceTokenizer: Megatron's `--tokenizer-model`, kept
in `tokenizer_file`); paths are absolute, contents' SHA-256 beside them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPT2_BPE = "GPT2BPETokenizer"
PRETRAINED_FROM_HF = "PretrainedFromHF"
# deepspeedai/Megatron-DeepSpeed's `--tokenizer-type X --tokenizer-model FILE` kinds.
SENTENCEPIECE = "SentencePieceTokenizer"
GPT_SENTENCEPIECE = "GPTSentencePieceTokenizer"
HF_TOKENIZER = "HFTokenizer"
# The keys a record is written with, in the order files hold them; a record writes back only
# those it was given or read (null included), so rewriting an old record changes nothing.
KEYS = (
    "type",
    "name_or_path",
    "tokenizer_file",
    "tokenizer_sha256",
    "vocab_file",
    "merge_file",
    "vocab_sha256",
    "merge_sha256",
    "vocab_size",
    "eod_id",
    "eod_token",
)
# Each kind's files, in the order a reader takes them; each `X_file` has its hash in `X_sha256`.
FILE_KEYS = {
    PRETRAINED_FROM_HF: ("tokenizer_file",),
    GPT2_BPE: ("vocab_file", "merge_file"),
    SENTENCEPIECE: ("tokenizer_file",),
    GPT_SENTENCEPIECE: ("tokenizer_file",),
    HF_TOKENIZER: ("tokenizer_file",),
}
# Kinds read from one file (`tokenizer_file`, its hash `tokenizer_sha256`): a tokenizer.json or
# a SentencePiece model. The same file read by two of them gives other ids or another EOD.
ONE_FILE_KINDS = (PRETRAINED_FROM_HF, SENTENCEPIECE, GPT_SENTENCEPIECE, HF_TOKENIZER)


def file_sha256(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class TokenizerRecord:
    """One recorded tokenizer. Build with `of(**fields)`, `of_files(kind, paths, **fields)` or
    `from_json(obj)`; write with `to_json()`."""

    type: str | None = None  # GPT2BPETokenizer, PretrainedFromHF, ONE_FILE_KINDS, Megatron's others
    name_or_path: str | None = None  # the flag's value (a hub name or a path) where it names one
    tokenizer_file: str | None = None  # tokenizer.json or SentencePiece model; None for a hub name
    tokenizer_sha256: str | None = None  # the file's, or the serialized hub tokenizer's
    vocab_file: str | None = None
    merge_file: str | None = None
    vocab_sha256: str | None = None
    merge_sha256: str | None = None
    vocab_size: int | None = None  # the tokenizer's; in meta.json the embedding rows trained
    eod_id: int | None = None
    eod_token: str | None = None
    # Known only in memory (never written): the largest id, where ids leave gaps past vocab_size.
    max_token_id: int | None = None
    recorded: frozenset[str] = frozenset()  # which of KEYS the record holds

    @classmethod
    def of(cls, **fields: Any) -> TokenizerRecord:
        """A record holding exactly `fields` (None ones are written as null)."""
        recorded = frozenset(fields) - {"max_token_id"}
        if unknown := recorded - set(KEYS):
            raise TypeError(f"not tokenizer record keys: {sorted(unknown)}")
        return cls(**fields, recorded=recorded)

    @classmethod
    def of_files(
        cls, kind: str, paths: Sequence[str | os.PathLike], **fields: Any
    ) -> TokenizerRecord:
        """A tokenizer read from files (FILE_KEYS[kind] order): their absolute paths and
        contents' SHA-256, so that a copy of the same files elsewhere is the same tokenizer."""
        keys = FILE_KEYS[kind]
        if len(paths) != len(keys):
            raise TypeError(f"{kind} reads {len(keys)} files, not {len(paths)}")
        files = {key: str(Path(path).resolve()) for key, path in zip(keys, paths, strict=True)}
        hashes = {_hash_key(key): file_sha256(path) for key, path in zip(keys, paths, strict=True)}
        return cls.of(type=kind, **files, **hashes, **fields)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> TokenizerRecord:
        """Any recorded form: a sidecar's `vocabulary` (today's, or the older one without
        `type`), meta.json's `tokenizer` (mds-train, import-hf) or Megatron args' fields.
        Keys it does not know are not kept."""
        if not isinstance(value, Mapping):
            raise ValueError(f"a tokenizer record is a JSON object, not {type(value).__name__}")
        return cls.of(**{key: value[key] for key in KEYS if key in value})

    @classmethod
    def from_sidecar(cls, metadata: Mapping[str, Any]) -> TokenizerRecord | None:
        """The record a dataset sidecar holds: its `vocabulary` object, else (older
        mds-tokenize) the `vocab_file` and `merge_file` of its `config` or of its first shard's;
        None when it names none."""
        if isinstance(metadata.get("vocabulary"), Mapping):
            return cls.from_json(metadata["vocabulary"]) or None
        config = metadata.get("config")
        if isinstance(config, Mapping) and "vocab_file" in config and "merge_file" in config:
            return cls.of(vocab_file=config["vocab_file"], merge_file=config["merge_file"])
        for shard in metadata.get("shard_metadata") or []:
            if isinstance(shard, Mapping) and (found := cls.from_sidecar(shard)):
                return found
        return None

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in KEYS if key in self.recorded}

    def updated(self, **fields: Any) -> TokenizerRecord:
        """This record with `fields` set (and recorded), as `{**record, **fields}` would."""
        recorded = self.recorded | (frozenset(fields) - {"max_token_id"})
        return dataclasses.replace(self, **fields, recorded=recorded)

    def __bool__(self) -> bool:
        return bool(self.recorded)

    @property
    def is_hugging_face(self) -> bool:
        """Read from a Hugging Face tokenizer.json (PretrainedFromHF or upstream's HFTokenizer)."""
        return self.kind in (PRETRAINED_FROM_HF, HF_TOKENIZER)

    @property
    def reads_one_file(self) -> bool:
        """Its kind reads one file, `tokenizer_file` (ONE_FILE_KINDS)."""
        return self.kind in ONE_FILE_KINDS

    @property
    def kind(self) -> str:
        """The recorded type where it is one of ONE_FILE_KINDS, else PretrainedFromHF for a
        record with a tokenizer.json hash (older sidecars hold no type), else the recorded type;
        GPT-2 BPE when none is recorded."""
        if self.type in ONE_FILE_KINDS:
            return self.type
        if self.tokenizer_sha256 is not None:
            return PRETRAINED_FROM_HF
        return self.type or GPT2_BPE

    @property
    def files(self) -> tuple[str | None, ...]:
        """The paths of the files its kind reads, in FILE_KEYS order (None where not recorded);
        () for a kind whose files are unknown here."""
        return tuple(getattr(self, key) for key in FILE_KEYS.get(self.kind, ()))

    @property
    def names_tokenizer(self) -> bool:
        """It says which tokenizer it is (a type or files), not only a size and an EOD."""
        return self.type is not None or self.vocab_file is not None

    @property
    def records_contents(self) -> bool:
        """It holds its files' SHA-256 (as mds records them; Megatron's args name only paths)."""
        return any(getattr(self, _hash_key(key)) for key in FILE_KEYS.get(self.kind, ()))

    @property
    def files_at_hand(self) -> bool:
        """Every file it names is readable here."""
        files = self.files
        return bool(files) and all(file and Path(file).is_file() for file in files)

    def embedding_rows(self) -> int:
        """Embedding rows before padding: one per id, and ids may leave gaps past vocab_size
        (Megatron sizes by vocab_size alone). A record read from a file knows no max_token_id;
        meta.json's vocab_size is already this number."""
        assert self.vocab_size is not None, "a record without vocab_size sizes no model"
        if self.max_token_id is None:
            return self.vocab_size
        return max(self.vocab_size, self.max_token_id + 1)

    def label(self) -> str:
        """The tokenizer in a few words, for messages."""
        if self.reads_one_file:
            return f"{self.kind} {self.tokenizer_file or self.name_or_path}"
        if self.vocab_file is None:
            size = "" if self.vocab_size is None else f" of {self.vocab_size} ids"
            return f"a {self.type or 'tokenizer'}{size} (no files recorded)"
        return f"{self.vocab_file} + {self.merge_file}"

    def same_as(self, other: TokenizerRecord) -> bool:
        """Same files (by content where known, else by path) and, where both record one, the
        same EOD. A tokenizer built in memory names no files: only an equal record matches."""
        if None not in (self.eod_id, other.eod_id) and self.eod_id != other.eod_id:
            return False
        if self.reads_one_file != other.reads_one_file:
            return False
        if self.reads_one_file and self.kind != other.kind:
            return False
        if not (self._names_files and other._names_files):
            return self.to_json() == other.to_json()
        if not self.reads_one_file and self._gpt2_files == other._gpt2_files:
            return True
        return self._identity() == other._identity()

    @property
    def _gpt2_files(self) -> tuple[str | None, str | None]:
        return self.vocab_file, self.merge_file

    @property
    def _names_files(self) -> bool:
        return self.reads_one_file or {"vocab_file", "merge_file"} <= self.recorded

    def _identity(self) -> tuple:
        """Contents' hashes when recorded or still readable, else the paths."""
        if self.reads_one_file:
            digest, file = self.tokenizer_sha256, self.tokenizer_file
            if digest is None and file is not None:
                try:
                    digest = file_sha256(file)
                except OSError:
                    pass
            return ("sha256", digest) if digest else ("path", file or self.name_or_path)
        hashes = []
        for key in FILE_KEYS[GPT2_BPE]:
            digest = getattr(self, _hash_key(key))
            if digest is None:
                try:
                    digest = file_sha256(getattr(self, key))
                except (OSError, TypeError):  # gone, or recorded as null
                    return ("paths", *self._gpt2_files)
            hashes.append(digest)
        return ("sha256", *hashes)


def _hash_key(file_key: str) -> str:
    return file_key.replace("_file", "_sha256")
