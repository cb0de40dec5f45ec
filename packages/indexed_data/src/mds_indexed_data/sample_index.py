"""doc_idx, sample_idx and shuffle_idx of a split, as bigscience's `_build_index_mappings`.

Same arithmetic, same dtypes (doc_idx int32, sample_idx int32, shuffle_idx uint32) and the same
`np.random.RandomState(seed)` consumed in the same order (doc_idx shuffle(s), then shuffle_idx
shuffle(s)), so the arrays equal upstream's. Dtypes widen to int64 only where upstream overflows.
"""

from dataclasses import dataclass

import numpy as np

from mds_indexed_data import helpers

INT32_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True)
class IndexMappings:
    doc_idx: np.ndarray  # document ids (item ids of the .bin), epoch after epoch, shuffled
    sample_idx: np.ndarray  # [num_samples + 1, 2]: (position in doc_idx, token offset)
    shuffle_idx: np.ndarray  # sample order
    num_epochs: int
    separate_last_epoch: bool


def num_epochs_needed(*, tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Smallest E >= 1 with (E*T - 1) // L >= n: a sample is L + 1 tokens, neighbours share one."""
    if tokens_per_epoch <= 0:
        raise ValueError("a split with no tokens cannot give samples")
    # (E*T - 1) // L >= n  <=>  E*T - 1 >= n*L  <=>  E >= (n*L + 1) / T; integer ceil, no float.
    return max(1, -(-(num_samples * seq_length + 1) // tokens_per_epoch))


def separate_last_epoch_needed(
    *, tokens_per_epoch: int, seq_length: int, num_samples: int, num_epochs: int, cutoff: float
) -> bool:
    """bigscience's rule: shuffle the last epoch apart when it is used for less than `cutoff` of it.

    Upstream asserts n_last <= samples per epoch, which fails for some exact inputs (T=7, L=3, n=9);
    like Microsoft's fork we allow one more, which never separates, so no valid case changes.
    """
    if num_epochs == 1:
        return False
    from_previous_epochs = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
    last_epoch_samples = num_samples - from_previous_epochs
    samples_per_epoch = (tokens_per_epoch - 1) // seq_length
    assert 0 <= last_epoch_samples <= samples_per_epoch + 1
    return last_epoch_samples < int(cutoff * samples_per_epoch)


def _shuffled_epochs(
    documents: np.ndarray, num_epochs: int, rng: np.random.RandomState
) -> np.ndarray:
    doc_idx = np.tile(documents, num_epochs)
    rng.shuffle(doc_idx)
    return doc_idx


def build_doc_idx(
    documents: np.ndarray, *, num_epochs: int, separate_last_epoch: bool, rng: np.random.RandomState
) -> np.ndarray:
    """`documents` repeated per epoch and shuffled once, or (separate) E-1 epochs then the last."""
    dtype = np.int32 if len(documents) == 0 or documents[-1] <= INT32_MAX else np.int64
    documents = documents.astype(dtype, copy=False)
    if not separate_last_epoch or num_epochs == 1:
        return _shuffled_epochs(documents, num_epochs, rng)
    first = _shuffled_epochs(documents, num_epochs - 1, rng)
    last = _shuffled_epochs(documents, 1, rng)
    return np.concatenate((first, last))


def build_shuffle_idx(*, num_first: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    """arange(0, num_first) shuffled, then arange(num_first, total) shuffled separately."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    first = np.arange(num_first, dtype=dtype)
    rng.shuffle(first)
    if num_first == total:
        return first
    last = np.arange(num_first, total, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


def build_index_mappings(
    *,
    sizes: np.ndarray,
    document_range: tuple[int, int],
    num_samples: int,
    seq_length: int,
    seed: int,
    cutoff: float,
) -> IndexMappings:
    """The three arrays for documents [start, end) of `sizes` (int32 token counts of every item)."""
    start, end = document_range
    documents = np.arange(start, end, dtype=np.int64)
    tokens_per_epoch = int(sizes[start:end].sum(dtype=np.int64))
    num_epochs = num_epochs_needed(
        tokens_per_epoch=tokens_per_epoch, seq_length=seq_length, num_samples=num_samples
    )
    separate = separate_last_epoch_needed(
        tokens_per_epoch=tokens_per_epoch,
        seq_length=seq_length,
        num_samples=num_samples,
        num_epochs=num_epochs,
        cutoff=cutoff,
    )
    rng = np.random.RandomState(seed)
    doc_idx = build_doc_idx(documents, num_epochs=num_epochs, separate_last_epoch=separate, rng=rng)

    total_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    # Upstream's int32 rows overflow past 2**31 doc_idx entries; token offsets always fit (sizes are
    # int32), so the row dtype only depends on the length of doc_idx.
    sample_dtype = np.int32 if len(doc_idx) <= INT32_MAX else np.int64
    sizes32 = np.ascontiguousarray(sizes, dtype=np.int32)
    sample_idx = helpers.build_sample_idx(sizes32, doc_idx, seq_length, total_samples, sample_dtype)

    num_first = (
        ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length if separate else total_samples
    )
    shuffle_idx = build_shuffle_idx(num_first=num_first, total=total_samples, rng=rng)
    return IndexMappings(
        doc_idx=doc_idx,
        sample_idx=sample_idx,
        shuffle_idx=shuffle_idx,
        num_epochs=num_epochs,
        separate_last_epoch=separate,
    )
