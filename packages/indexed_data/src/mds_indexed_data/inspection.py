"""What `mds-index info` and `mds-index show` print: dataset statistics and one document or sample.

Decoding uses the mds-tokenize public API
(`GPT2BPETokenizer.from_files(vocab, merges).decode(ids)`), imported only when vocabulary files
are given, so this package does not depend on it.
"""

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mds_indexed_data.reader import IndexedDatasetReader


def length_histogram(sizes: np.ndarray) -> list[tuple[int, int, int]]:
    """(low, high, count) over power-of-two token-count bins [low, high); empty bins skipped."""
    if len(sizes) == 0:
        return []
    sizes = np.asarray(sizes, dtype=np.int64)
    # Bin 0 holds empty items, bin k >= 1 holds sizes in [2**(k-1), 2**k).
    bins = np.zeros(len(sizes), dtype=np.int64)
    positive = sizes > 0
    bins[positive] = np.floor(np.log2(sizes[positive])).astype(np.int64) + 1
    counts = np.bincount(bins)
    rows = []
    for k, count in enumerate(counts):
        if count:
            low, high = (0, 1) if k == 0 else (2 ** (k - 1), 2**k)
            rows.append((low, high, int(count)))
    return rows


def info_text(prefix: str) -> str:
    reader = IndexedDatasetReader(prefix)
    sizes = reader.sizes
    lines = [
        f"dataset:   {prefix}",
        f"dtype:     {reader.dtype}",
        f"documents: {reader.num_documents}",
        f"items:     {len(reader)}",
        f"tokens:    {reader.num_tokens}",
    ]
    if len(sizes):
        lines.append(
            f"item tokens: min {int(sizes.min())}, mean {float(sizes.mean()):.1f}, "
            f"median {float(np.median(sizes)):.1f}, max {int(sizes.max())}"
        )
        lines.append("length histogram (tokens per item):")
        width = max(len(str(count)) for _, _, count in length_histogram(sizes))
        for low, high, count in length_histogram(sizes):
            bar = "#" * max(1, round(50 * count / len(sizes)))
            lines.append(f"  [{low:>7}, {high:>7}) {count:>{width}} {bar}")
    return "\n".join(lines)


def document_tokens(reader: IndexedDatasetReader, document: int) -> np.ndarray:
    """All tokens of document `document` (its items back to back); ValueError naming --doc."""
    if not 0 <= document < reader.num_documents:
        raise ValueError(
            f"--doc {document}: {reader.prefix} has documents 0..{reader.num_documents - 1}"
        )
    first, last = int(reader.doc_idx[document]), int(reader.doc_idx[document + 1])
    if first == last:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([reader.get(item) for item in range(first, last)]).astype(np.int64)


def make_decoder(vocab_file: str | None, merge_file: str | None):
    """A function ids -> text, or None when no vocabulary was given (ids are printed then)."""
    if vocab_file is None and merge_file is None:
        return None
    if vocab_file is None or merge_file is None:
        raise ValueError("--vocab-file and --merge-file go together; give both or neither")
    for flag, path in (("--vocab-file", vocab_file), ("--merge-file", merge_file)):
        if not Path(path).is_file():
            raise ValueError(f"{flag} {path}: file not found")
    try:
        from mds_tokenize import GPT2BPETokenizer
    except ImportError:
        raise ValueError(
            "decoding needs mds-tokenize: pip install mds-tokenize (or mds-indexed-data[decode]), "
            "or drop --vocab-file/--merge-file to print token ids"
        ) from None
    tokenizer = GPT2BPETokenizer.from_files(vocab_file, merge_file)
    return lambda ids: tokenizer.decode([int(i) for i in ids])


def render_tokens(tokens: Sequence[int], decoder) -> str:
    if decoder is None:
        return " ".join(str(int(token)) for token in tokens)
    return decoder(tokens)
