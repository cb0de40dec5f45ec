"""What `mds-index info` and `mds-index show` print: dataset statistics, and the token ids of one
document or training sample, one line per item or document run.

Text is not this package's business (it depends on no tokenizer): `mds-index show ... |
mds-tokenize decode --vocab-file V --merge-file M` turns each line of ids into its text.
"""

from collections.abc import Iterable

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


def document_items(reader: IndexedDatasetReader, document: int) -> list[np.ndarray]:
    """The items of document `document` (one for GPT datasets, one per sentence for datasets
    tokenized with sentence splitting); ValueError naming --doc."""
    if not 0 <= document < reader.num_documents:
        raise ValueError(
            f"--doc {document}: {reader.prefix} has documents 0..{reader.num_documents - 1}"
        )
    first, last = int(reader.doc_idx[document]), int(reader.doc_idx[document + 1])
    return [reader.get(item) for item in range(first, last)]


def render_lines(runs: Iterable[np.ndarray]) -> str:
    """One line of space-separated ids per run of tokens."""
    return "\n".join(" ".join(map(str, np.asarray(run).tolist())) for run in runs)
