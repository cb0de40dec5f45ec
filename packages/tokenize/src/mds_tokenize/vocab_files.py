"""Readers of the GPT-2 tokenizer files: `vocab.json` (token -> id), `merges.txt` (ranked pairs).

Follows Megatron's `gpt2_tokenization.py` (README: "vocab.json and merges.txt") with two fixes,
each logged as a warning: a merges file without a `#` header keeps its first merge, and one
without a trailing newline keeps its last merge (Megatron silently drops both).
"""

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)


class TokenizerFileError(ValueError):
    """A missing or malformed vocab/merges file (a user mistake; the message names the file)."""


def _read_text(path: Path, *, what: str, flag: str) -> str:
    path = Path(path)
    if not path.is_file():
        raise TokenizerFileError(f"{path}: {what} not found; pass an existing file with {flag}")
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as error:
        raise TokenizerFileError(
            f"{path}: {what} is not UTF-8 (byte {error.start}); pass the GPT-2 {what} with {flag}"
        ) from None


def load_vocab(path: str | Path) -> dict[str, int]:
    """token string -> id, validated: a non-empty JSON object of non-negative integer ids."""
    text = _read_text(Path(path), what="vocab file", flag="--vocab-file")
    try:
        vocab = json.loads(text)
    except json.JSONDecodeError as error:
        raise TokenizerFileError(
            f"{path}:{error.lineno}: vocab file is not valid JSON ({error.msg}); "
            "pass a vocab.json with --vocab-file"
        ) from None
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerFileError(
            f"{path}: vocab file must be a non-empty JSON object mapping token strings to ids"
        )
    for token, token_id in vocab.items():
        if type(token_id) is not int or token_id < 0:
            raise TokenizerFileError(
                f"{path}: token {token!r} has id {token_id!r}; ids must be non-negative integers"
            )
    return vocab


def load_merges(path: str | Path) -> list[tuple[str, str]]:
    """The merge pairs in rank order (rank = position in the list)."""
    path = Path(path)
    text = _read_text(path, what="merges file", flag="--merge-file")
    if not text:
        raise TokenizerFileError(
            f"{path}: merges file is empty; expected a '#version' header and one 'left right' pair "
            "per line (pass the GPT-2 merges.txt with --merge-file)"
        )
    lines = text.split("\n")
    first_line_number = 1
    if lines[0].startswith("#"):
        lines = lines[1:]
        first_line_number = 2
    else:
        logger.warning(
            "%s: first line %r is not a '#version' header; Megatron drops the first line "
            "unconditionally (losing this merge), mds-tokenize keeps it",
            path,
            lines[0],
        )
    if lines and lines[-1] == "":
        lines = lines[:-1]
    elif lines:
        logger.warning(
            "%s: no newline after the last line %r; Megatron would drop that merge, mds-tokenize "
            "keeps it (ids of words using it differ from Megatron's); end the file with a newline "
            "to silence this",
            path,
            lines[-1],
        )
    merges = []
    for offset, line in enumerate(lines):
        parts = line.split()
        if not parts:
            continue  # a blank line holds no pair; Megatron's empty tuple never matches either
        if len(parts) != 2:
            raise TokenizerFileError(
                f"{path}:{first_line_number + offset}: expected two space-separated symbols, "
                f"got {line!r}; is this a GPT-2 merges.txt?"
            )
        merges.append((parts[0], parts[1]))
    return merges
