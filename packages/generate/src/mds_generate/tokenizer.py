"""Text streaming: `TextStream` turns ids into text as they arrive, holding back the bytes of a
character that a later token completes. The tokenizer itself is mds_tokenize's one interface
(`Tokenizer`: GPT-2 BPE files, a learned vocabulary or a Hugging Face tokenizer.json).
"""

from __future__ import annotations

import codecs

from mds_tokenize.interface import Tokenizer


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
