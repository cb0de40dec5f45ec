"""The frozen, validated configuration of `mds-tokenize learn`; every error names its flag."""

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from mds_common.flags import flag, restate

from mds_tokenize.byte_level import END_OF_TEXT, bytes_to_unicode
from mds_tokenize.config import JsonKeysFlags

NUM_BYTE_TOKENS = 256


@dataclass(frozen=True, kw_only=True)
class LearnConfig:
    """`mds-tokenize learn`: each field a flag (mds_common.flags), the command generated from it."""

    inputs: tuple[Path, ...] = flag(
        "--input",
        multiple=True,
        required=True,
        help="jsonl corpus to learn from (.jsonl, .jsonl.gz, .jsonl.xz or .jsonl.zst by "
        "extension); several: --input a.jsonl b.jsonl.zst.",
    )
    vocab_size: int = flag(
        "--vocab-size",
        required=True,
        help="Number of entries in vocab.json: 256 byte tokens + learned tokens + special tokens.",
    )
    output_dir: Path = flag(
        "--output-dir",
        required=True,
        help="Folder for vocab.json, merges.txt, learn-config.json (and tokenizer.json).",
    )
    json_keys: tuple[str, ...] = restate(JsonKeysFlags, "json_keys", note="All are learned from.")
    min_frequency: int = flag(
        "--min-frequency",
        default=2,
        help="Stop merging when the most frequent pair occurs fewer times than this.",
    )
    special_tokens: tuple[str, ...] = flag(
        "--special-tokens",
        multiple=True,
        default=(END_OF_TEXT,),
        help=f"Special tokens appended after the merges, in order: --special-tokens A B. "
        f"{END_OF_TEXT} (the EOD) is always included, added last when not listed.",
    )
    workers: int | None = flag(  # None: every CPU this process may run on
        "--workers",
        help="Processes counting words in parallel (default: every CPU this process may use).",
    )
    tokenizer_json: bool = flag(
        "--tokenizer-json",
        default=False,
        help="Also write tokenizer.json: the same vocabulary for Hugging Face tokenizers "
        "(identical ids; use with --tokenizer-type PretrainedFromHF).",
    )

    def __post_init__(self) -> None:
        if not self.inputs:
            raise ValueError("--input is required: pass at least one jsonl file")
        for path in self.inputs:
            if not Path(path).is_file():
                raise ValueError(f"--input {path}: no such file; check the path")
        if not self.json_keys or any(not key for key in self.json_keys):
            raise ValueError(
                "--json-keys must name at least one non-empty key, e.g. --json-keys text"
            )
        if self.min_frequency < 1:
            raise ValueError(f"--min-frequency {self.min_frequency}: must be at least 1")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers {self.workers}: must be at least 1")
        for token in self.special_tokens:
            if not token:
                raise ValueError("--special-tokens: an empty string cannot be a token; remove it")
            if self.special_tokens.count(token) > 1:
                raise ValueError(f"--special-tokens lists {token!r} twice; list each token once")
        if self.vocab_size < self.min_vocab_size:
            raise ValueError(
                f"--vocab-size {self.vocab_size} is too small: the 256 byte tokens and "
                f"{self.min_vocab_size - NUM_BYTE_TOKENS} special token(s) need at least "
                f"{self.min_vocab_size}; raise --vocab-size"
            )

    @property
    def all_special_tokens(self) -> tuple[str, ...]:
        """The specials in vocabulary order: as given, with the EOD appended when missing."""
        if END_OF_TEXT in self.special_tokens:
            return self.special_tokens
        return (*self.special_tokens, END_OF_TEXT)

    @property
    def min_vocab_size(self) -> int:
        # A special spelled like one byte symbol shares that symbol's id (no duplicate entries).
        byte_symbols = set(bytes_to_unicode().values())
        return NUM_BYTE_TOKENS + sum(token not in byte_symbols for token in self.all_special_tokens)

    @property
    def num_workers(self) -> int:
        return self.workers if self.workers is not None else len(os.sched_getaffinity(0))

    def to_json_dict(self) -> dict:
        resolved = asdict(self)
        resolved["inputs"] = [str(Path(path).resolve()) for path in self.inputs]
        resolved["output_dir"] = str(Path(self.output_dir).resolve())
        resolved["special_tokens"] = list(self.all_special_tokens)
        resolved["workers"] = self.num_workers
        return resolved
