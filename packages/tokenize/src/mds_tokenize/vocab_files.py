"""Readers of the GPT-2 tokenizer files: `vocab.json` (token -> id), `merges.txt` (ranked pairs).

Follows Megatron's `gpt2_tokenization.py` (README: "vocab.json and merges.txt") with two fixes,
each logged as a warning: a merges file without a `#` header keeps its first merge, and one
without a trailing newline keeps its last merge (Megatron silently drops both). `check_pair` refuses
a vocab and merges file that do not belong together (Megatron would map the gaps to id 0).
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from mds_tokenize.byte_level import bytes_to_unicode

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


# A matching pair leaves only its special tokens (GPT-2: 1, RoBERTa: 5) out of reach of the merges;
# thousands of unreachable tokens mean the merges were learned for another vocabulary.
MAX_UNREACHABLE_FRACTION = 0.1
MAX_UNREACHABLE_ALWAYS_ACCEPTED = 256


@dataclass(frozen=True)
class PairGaps:
    """Where a vocab and a merges list disagree (nothing, for files written together). Found by the
    tokenizer's constructor from the lookups it makes anyway, so checking costs no extra pass."""

    missing_byte_symbols: tuple[str, ...]  # byte symbols the vocab lacks
    missing_merge_ranks: tuple[int, ...]  # merges whose result the vocab lacks
    num_unreachable: int  # vocab tokens that are neither a byte symbol nor a merge result


def check_pair(
    gaps: PairGaps,
    *,
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    vocab_file: str | Path,
    merge_file: str | Path,
) -> None:
    """Raises TokenizerFileError unless the two files were written together: every byte symbol and
    every merge result is a vocab token, and nearly every vocab token is a byte or a merge result
    (Megatron would give every gap id 0 and go on)."""
    mismatch = f"{vocab_file} and {merge_file} do not belong together"
    remedy = "pass the vocab.json and merges.txt written together (GPT-2's pair, or one learn run)"
    if gaps.missing_byte_symbols:
        raise TokenizerFileError(
            f"{vocab_file}: {len(gaps.missing_byte_symbols)} of the 256 byte symbols are not in "
            f"the vocabulary (e.g. {gaps.missing_byte_symbols[0]!r}), so text holding them would "
            "get id 0; is this a GPT-2 byte-level BPE vocab.json?"
        )
    if gaps.missing_merge_ranks:
        rank = gaps.missing_merge_ranks[0]
        left, right = merges[rank]
        raise TokenizerFileError(
            f"{mismatch}: {len(gaps.missing_merge_ranks):,} of the {len(merges):,} merges make a "
            f"token the vocabulary lacks (the first, rank {rank}: {left!r} + {right!r} -> "
            f"{left + right!r}), which would get id 0; {remedy}"
        )
    limit = max(MAX_UNREACHABLE_ALWAYS_ACCEPTED, MAX_UNREACHABLE_FRACTION * len(vocab))
    if gaps.num_unreachable > limit:
        reachable = {left + right for left, right in merges}
        reachable.update(bytes_to_unicode().values())
        example = next(token for token in vocab if token not in reachable)
        raise TokenizerFileError(
            f"{mismatch}: {gaps.num_unreachable:,} of the vocabulary's {len(vocab):,} tokens (e.g. "
            f"{example!r}, id {vocab[example]}) are neither a byte nor made by any of the "
            f"{len(merges):,} merges; {remedy}"
        )
