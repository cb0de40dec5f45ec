"""The tokenizer the sampler and the evaluations use, built in one place, and text streaming.

`build_tokenizer` is the single construction point (GPT-2 byte-level BPE from `vocab.json` +
`merges.txt`, Megatron's `GPT2BPETokenizer`); `TextStream` turns ids into text as they arrive,
holding back the bytes of a character that a later token completes.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    """What mds-generate needs of a tokenizer."""

    vocab_size: int

    @property
    def eod(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids) -> str: ...


def build_tokenizer(vocab_file: Path, merge_file: Path) -> Tokenizer:
    """GPT-2 BPE from its two files; a ValueError naming the file for a missing or bad one."""
    from mds_tokenize import GPT2BPETokenizer

    return GPT2BPETokenizer.from_files(vocab_file, merge_file)


class TextStream:
    """Incremental decoding: `push(id)` returns the text that id completes ('' while a multi-byte
    character is unfinished), so streamed pieces concatenate to `decode(ids)`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._token_bytes = getattr(tokenizer, "token_bytes", None)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._text = ""

    def push(self, token_id: int) -> str:
        if self._token_bytes is not None:
            return self._utf8.decode(self._token_bytes(token_id))
        # A tokenizer without byte access: decode the whole prefix, emit what grew.
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids)
        stable = text.rstrip("\ufffd")  # an unfinished character decodes as U+FFFD for now
        piece, self._text = stable[len(self._text) :], stable
        return piece

    def flush(self) -> str:
        """Whatever is held back at the end (an unfinished character becomes U+FFFD)."""
        if self._token_bytes is not None:
            return self._utf8.decode(b"", final=True)
        return self._tokenizer.decode(self._ids)[len(self._text) :]
