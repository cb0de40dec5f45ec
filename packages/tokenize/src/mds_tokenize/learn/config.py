"""The frozen, validated configuration of `mds-tokenize learn`; every error names its flag."""

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from mds_tokenize.byte_level import END_OF_TEXT, bytes_to_unicode

NUM_BYTE_TOKENS = 256


@dataclass(frozen=True)
class LearnConfig:
    inputs: tuple[Path, ...]
    vocab_size: int
    output_dir: Path
    json_keys: tuple[str, ...] = ("text",)
    min_frequency: int = 2
    special_tokens: tuple[str, ...] = (END_OF_TEXT,)
    workers: int | None = None  # None: every CPU this process may run on
    tokenizer_json: bool = False  # also write tokenizer.json (Hugging Face tokenizers format)

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
