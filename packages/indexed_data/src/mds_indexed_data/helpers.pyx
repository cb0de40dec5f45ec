# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The two hot loops of GPT sample indexing, compiled at install time (bigscience `helpers.cpp`).

`build_sample_idx` follows `helpers.build_sample_idx` and `build_blending_indices` follows
`helpers.build_blending_indices` step for step; only the output dtypes are widened when the
upstream int32/uint8 would overflow (the caller picks them, see sample_index.py / blending.py).
"""

import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t

ctypedef fused doc_index_t:
    int32_t
    int64_t

ctypedef fused sample_out_t:
    int32_t
    int64_t

ctypedef fused dataset_out_t:
    uint8_t
    uint16_t
    int32_t


# Document sizes are gathered in chunks before the walk: the gather's loads are independent of each
# other, so the CPU overlaps their cache misses, whereas inside the walk each load sits behind the
# sample-boundary branch, which mispredicts about once per sample and serialises them.
cdef enum:
    GATHER_CHUNK = 4096


cdef void _fill_sample_idx(const int32_t[::1] sizes, const doc_index_t[::1] doc_idx,
                           int64_t seq_length, int64_t num_samples,
                           sample_out_t[:, ::1] out) noexcept nogil:
    cdef int32_t gathered[GATHER_CHUNK]
    cdef int64_t chunk_start = 0   # doc_idx position of gathered[0]
    cdef int64_t chunk_end = 0     # one past the last gathered position
    cdef int64_t num_docs = doc_idx.shape[0]
    cdef int64_t sample, position
    cdef int64_t doc_position = 0  # index into doc_idx
    cdef int64_t offset = 0        # token offset inside doc_idx[doc_position]
    cdef int64_t remaining, doc_length
    out[0, 0] = 0
    out[0, 1] = 0
    for sample in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            if doc_position >= chunk_end:
                chunk_start = doc_position
                chunk_end = min(chunk_start + GATHER_CHUNK, num_docs)
                for position in range(chunk_start, chunk_end):
                    gathered[position - chunk_start] = sizes[doc_idx[position]]
            doc_length = gathered[doc_position - chunk_start] - offset
            remaining -= doc_length
            if remaining <= 0:
                # The sample ends inside this document; its last token is shared with the next
                # sample, hence the -1 (same reason as the -1 in the epoch count).
                offset += remaining + doc_length - 1
                remaining = 0
            else:
                doc_position += 1
                offset = 0
        out[sample, 0] = <sample_out_t>doc_position
        out[sample, 1] = <sample_out_t>offset


def build_sample_idx(sizes, doc_idx, int64_t seq_length, int64_t num_samples, out_dtype):
    """[num_samples + 1, 2] rows of (position in doc_idx, token offset) where each sample starts.

    `sizes` int32 (all items of the dataset), `doc_idx` int32/int64 document ids, `num_samples`
    = (num_epochs * tokens_per_epoch - 1) // seq_length; the caller guarantees doc_idx holds enough
    tokens for that many samples (it is derived from the same numbers).
    """
    cdef const int32_t[::1] sizes_view = np.ascontiguousarray(sizes, dtype=np.int32)
    doc_idx = np.ascontiguousarray(doc_idx)
    out = np.empty((num_samples + 1, 2), dtype=out_dtype)
    if doc_idx.dtype == np.int32:
        if out.dtype == np.int32:
            _fill_sample_idx[int32_t, int32_t](sizes_view, doc_idx, seq_length, num_samples, out)
        else:
            _fill_sample_idx[int32_t, int64_t](sizes_view, doc_idx, seq_length, num_samples, out)
    elif doc_idx.dtype == np.int64:
        if out.dtype == np.int32:
            _fill_sample_idx[int64_t, int32_t](sizes_view, doc_idx, seq_length, num_samples, out)
        else:
            _fill_sample_idx[int64_t, int64_t](sizes_view, doc_idx, seq_length, num_samples, out)
    else:
        raise TypeError(f"doc_idx must be int32 or int64, not {doc_idx.dtype}")
    return out


cdef void _fill_blending(const double[::1] weights, int64_t size, double* counts,
                         dataset_out_t[::1] dataset_index,
                         int64_t[::1] dataset_sample_index) noexcept nogil:
    # Counts are kept as doubles (exact below 2**53) so the inner loop has no int->float step;
    # the arithmetic is upstream's `w * x - (double)count` either way.
    cdef int64_t num_datasets = weights.shape[0]
    cdef int64_t sample, dataset, best
    cdef double position, error, best_error
    for sample in range(size):
        position = <double>sample if sample > 1 else 1.0
        # Pick the dataset that lags its target share the most; ties go to the lowest index
        # because only a strictly larger error replaces the current best (as upstream).
        best = 0
        best_error = weights[0] * position - counts[0]
        for dataset in range(1, num_datasets):
            error = weights[dataset] * position - counts[dataset]
            if error > best_error:
                best_error = error
                best = dataset
        dataset_index[sample] = <dataset_out_t>best
        dataset_sample_index[sample] = <int64_t>counts[best]
        counts[best] += 1.0


def build_blending_indices(weights, int64_t size, index_dtype):
    """(dataset_index, dataset_sample_index, counts) of the error-greedy interleave of `size`.

    `weights` must already be normalised the way the caller wants (upstream divides by their sum);
    `index_dtype` is uint8, uint16 or int32 and must hold len(weights) - 1.
    """
    cdef const double[::1] weights_view = np.ascontiguousarray(weights, dtype=np.float64)
    if weights_view.shape[0] == 0:
        raise ValueError("blending needs at least one dataset")
    counts = np.zeros(weights_view.shape[0], dtype=np.float64)
    cdef double[::1] counts_view = counts
    dataset_index = np.empty(size, dtype=index_dtype)
    dataset_sample_index = np.empty(size, dtype=np.int64)
    if dataset_index.dtype == np.uint8:
        _fill_blending[uint8_t](
            weights_view, size, &counts_view[0], dataset_index, dataset_sample_index
        )
    elif dataset_index.dtype == np.uint16:
        _fill_blending[uint16_t](
            weights_view, size, &counts_view[0], dataset_index, dataset_sample_index
        )
    elif dataset_index.dtype == np.int32:
        _fill_blending[int32_t](
            weights_view, size, &counts_view[0], dataset_index, dataset_sample_index
        )
    else:
        raise TypeError(f"index_dtype must be uint8, uint16 or int32, not {dataset_index.dtype}")
    return dataset_index, dataset_sample_index, counts.astype(np.int64)
