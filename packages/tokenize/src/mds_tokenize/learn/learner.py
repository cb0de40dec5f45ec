"""`mds-tokenize learn`: trains a byte-level BPE vocabulary and writes it in GPT-2's format.

Vocabulary layout: ids 0..255 are the byte symbols in GPT-2's own order (the ids GPT-2 gives them),
then one id per new merge result in merge order, then the special tokens. Files: `vocab.json`
(json.dumps of token -> id, like GPT-2's encoder.json) and `merges.txt` (`#version: 0.2`, then
`a b` lines); with --tokenizer-json also the same vocabulary as a Hugging Face `tokenizer.json`.
"""

import json
import logging
import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
from mds_common.files import write_files_atomically
from mds_common.sidecar import sidecar

from mds_tokenize.byte_level import END_OF_TEXT, bytes_to_unicode
from mds_tokenize.learn._merge import learn_merges
from mds_tokenize.learn.config import LearnConfig
from mds_tokenize.learn.counting import count_words
from mds_tokenize.learn.progress import Progress
from mds_tokenize.tokenizer_json import byte_level_bpe_json

logger = logging.getLogger("mds_tokenize.learn")

MERGES_HEADER = "#version: 0.2"
VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
CONFIG_FILE = "learn-config.json"
TOKENIZER_JSON_FILE = "tokenizer.json"


def byte_alphabet() -> list[str]:
    """The 256 byte symbols in id order: GPT-2's (its 188 printable bytes, then the other 68)."""
    return list(bytes_to_unicode().values())


def words_to_symbols(words: Counter[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flattens the distinct words into (symbol ids int32, offsets int64, counts int64), one byte
    symbol per UTF-8 byte, with the ids of `byte_alphabet()`."""
    encoded = [word.encode("utf-8") for word in words]
    lengths = np.fromiter((len(word) for word in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    byte_to_id = np.empty(256, dtype=np.int32)
    for token_id, byte in enumerate(bytes_to_unicode()):
        byte_to_id[byte] = token_id
    symbols = byte_to_id[np.frombuffer(b"".join(encoded), dtype=np.uint8)]
    counts = np.fromiter(words.values(), dtype=np.int64, count=len(words))
    return np.ascontiguousarray(symbols, dtype=np.int32), offsets, counts


def learn_vocabulary(
    *,
    words: Counter[str],
    vocab_size: int,
    special_tokens: tuple[str, ...],
    min_frequency: int,
    progress=None,
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Learns from word counts; returns (token -> id, merges as string pairs in rank order).

    Each step merges the adjacent pair with the highest count over all words (a word's count times
    its occurrences of the pair); ties go to the smallest (left id, right id)."""
    symbols, offsets, counts = words_to_symbols(words)
    token_strings = byte_alphabet()
    merges, _num_tokens = learn_merges(
        symbols,
        offsets,
        counts,
        token_strings,
        vocab_size=vocab_size,
        special_tokens=frozenset(special_tokens),
        min_frequency=min_frequency,
        progress=progress,
    )
    vocab = {token: token_id for token_id, token in enumerate(token_strings)}
    for token in special_tokens:
        # A special already spelled by a byte or merged token keeps that id (no duplicate key).
        vocab.setdefault(token, len(vocab))
    merge_strings = [(token_strings[left], token_strings[right]) for left, right in merges]
    return vocab, merge_strings


def write_vocabulary(
    *,
    output_dir: Path,
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    summary: dict,
    tokenizer_json: bool = False,
) -> None:
    """Writes vocab.json, merges.txt (header, one `a b` line per merge, trailing newline: Megatron
    drops the first line and the last split element), tokenizer.json if asked, and the resolved
    config with run statistics."""
    files = {
        output_dir / VOCAB_FILE: json.dumps(vocab),
        output_dir / MERGES_FILE: MERGES_HEADER + "\n" + "".join(f"{a} {b}\n" for a, b in merges),
    }
    if tokenizer_json:
        files[output_dir / TOKENIZER_JSON_FILE] = byte_level_bpe_json(vocab, merges)
    files[output_dir / CONFIG_FILE] = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_files_atomically(files)
    except OSError as error:
        raise ValueError(
            f"--output-dir {output_dir}: cannot write there ({error}); pick a writable folder"
        ) from None


def run(config: LearnConfig) -> dict:
    """Counts words, learns the merges, writes the files and the resolved config; returns the
    summary that learn-config.json holds."""
    started = time.perf_counter()
    total_bytes = sum(os.path.getsize(path) for path in config.inputs)
    with Progress(label="counting words", unit="MB", total=total_bytes / 1e6) as progress:
        words, num_documents = count_words(
            paths=config.inputs,
            json_keys=config.json_keys,
            num_workers=config.num_workers,
            on_chunk=lambda num_bytes: progress.advance(num_bytes / 1e6),
        )
    if not words:
        raise ValueError(
            f"--input {', '.join(map(str, config.inputs))}: no text found under --json-keys "
            f"{' '.join(config.json_keys)} ({num_documents} documents); pass a non-empty corpus"
        )
    counted = time.perf_counter()
    logger.info(
        "counted %d distinct words in %d documents in %.1fs",
        len(words),
        num_documents,
        counted - started,
    )

    target_merges = config.vocab_size - config.min_vocab_size
    with Progress(label="merging", unit="merges", total=target_merges) as progress:
        vocab, merges = learn_vocabulary(
            words=words,
            vocab_size=config.vocab_size,
            special_tokens=config.all_special_tokens,
            min_frequency=config.min_frequency,
            progress=progress.update,
        )
    if len(vocab) < config.vocab_size:
        logger.warning(
            "the corpus supports only %d tokens (no pair occurs at least --min-frequency %d "
            "times); "
            "wrote a %d-entry vocabulary instead of --vocab-size %d",
            len(vocab),
            config.min_frequency,
            len(vocab),
            config.vocab_size,
        )
    summary = sidecar(
        tool="mds-tokenize learn",
        distribution="mds-tokenize",
        inputs=config.inputs,
        config=config.to_json_dict(),
        num_documents=num_documents,
        num_distinct_words=len(words),
        num_merges=len(merges),
        vocab_size=len(vocab),
        eod_id=vocab[END_OF_TEXT],
        seconds=round(time.perf_counter() - started, 3),
    )
    write_vocabulary(
        output_dir=config.output_dir,
        vocab=vocab,
        merges=merges,
        summary=summary,
        tokenizer_json=config.tokenizer_json,
    )
    logger.info(
        "wrote %s to %s: %d tokens, %d merges, in %.1fs",
        ", ".join(
            (VOCAB_FILE, MERGES_FILE) + ((TOKENIZER_JSON_FILE,) if config.tokenizer_json else ())
        ),
        config.output_dir,
        len(vocab),
        len(merges),
        summary["seconds"],
    )
    return summary
