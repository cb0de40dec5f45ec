"""Turns one block of jsonl lines into token arrays: parse, validate, encode (runs in the workers).

Follows Megatron's `Encoder.encode` at document level (README: "Documents and EOD"): one document
per line and key, EOD appended to non-empty documents, documents with no tokens skipped. Bad lines
(not UTF-8, not JSON, not an object, missing key, non-string value) are reported with their line.
"""

import json
from dataclasses import dataclass, field

import numpy as np

from mds_tokenize.input_reader import Block
from mds_tokenize.interface import Tokenizer


@dataclass(frozen=True)
class BadLine:
    line: int  # 1-based, in the file (or in the shard when partitioned)
    offset: int  # byte offset of the line's start in the input
    reason: str


@dataclass
class BlockResult:
    """Per key: tokens of the block's non-empty documents back to back, and their lengths."""

    ids: dict[str, np.ndarray]
    lengths: dict[str, np.ndarray]
    num_docs: int  # lines accepted (whether or not every key produced tokens)
    num_empty: dict[str, int]
    num_bytes: int
    bad_lines: list[BadLine] = field(default_factory=list)


@dataclass(frozen=True)
class EncodeSettings:
    json_keys: tuple[str, ...]
    append_eod: bool
    dtype: np.dtype
    stop_at_bad_line: bool
    keep_empty: bool = False  # lengths keep the 0 of each empty document (--deepspeedai-index)


def _type_name(value) -> str:
    return {dict: "an object", list: "an array", type(None): "null", bool: "a boolean"}.get(
        type(value), "a number"
    )


def parse_line(raw: bytes, json_keys: tuple[str, ...]) -> tuple[list[str] | None, str]:
    """(texts per key, "") for a good line, (None, reason) for a bad one."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"invalid UTF-8 at byte {error.start + 1} of the line"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return None, f"not valid JSON ({error.msg} at column {error.colno})"
    if type(record) is not dict:
        return None, f"expected a JSON object, got {_type_name(record)}"
    texts = []
    for key in json_keys:
        if key not in record:
            present = ", ".join(repr(name) for name in list(record)[:5]) or "none"
            return None, f"missing key {key!r} (keys: {present}); choose keys with --json-keys"
        value = record[key]
        if type(value) is not str:
            return None, f"value of {key!r} is {_type_name(value)}, expected a string"
        texts.append(value)
    # Only a \ud800-\udfff escape can put a surrogate into a decoded str; a lone one has no UTF-8.
    if b"\\ud" in raw or b"\\uD" in raw:
        for key, value in zip(json_keys, texts, strict=True):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                return None, (
                    f"value of {key!r} holds a lone surrogate escape "
                    f"(\\u{ord(value[error.start]):04x}), "
                    "which is not valid Unicode"
                )
    return texts, ""


def encode_block(tokenizer: Tokenizer, block: Block, settings: EncodeSettings) -> BlockResult:
    json_keys = settings.json_keys
    texts: list[list[str]] = [[] for _ in json_keys]
    bad_lines: list[BadLine] = []
    line_offset = block.offset
    lines = block.data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # after the final newline
    for index, raw in enumerate(lines):
        start = line_offset
        line_offset += len(raw) + 1
        if not raw.strip():
            continue  # blank lines hold no document (Megatron stops on them with a JSON error)
        record_texts, reason = parse_line(raw, json_keys)
        if record_texts is None:
            bad_lines.append(BadLine(block.first_line + index, start, reason))
            if settings.stop_at_bad_line:
                break
            continue
        for key_texts, text in zip(texts, record_texts, strict=True):
            key_texts.append(text)
    result = BlockResult(
        ids={},
        lengths={},
        num_docs=len(texts[0]),
        num_empty={},
        num_bytes=len(block.data),
        bad_lines=bad_lines,
    )
    if bad_lines and settings.stop_at_bad_line:
        return result  # the run stops here; encoding the rest would be wasted work
    for key, key_texts in zip(json_keys, texts, strict=True):
        ids, lengths = tokenizer.encode_batch(key_texts, append_eod=settings.append_eod)
        assert not (lengths < 0).any(), "surrogates are rejected by parse_line"
        non_empty = lengths > 0
        result.num_empty[key] = int(len(lengths) - non_empty.sum())
        result.ids[key] = ids.astype(settings.dtype, copy=False)
        kept = lengths if settings.keep_empty else lengths[non_empty]
        result.lengths[key] = kept.astype(np.int32)
    return result
