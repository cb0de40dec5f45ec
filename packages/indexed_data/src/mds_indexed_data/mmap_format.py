"""Constants, header codec and body check of Megatron's mmap indexed dataset (`MMIDIDX`, v1).

Layout (little endian, no padding): magic[9] | version u64 | dtype code u8 | N u64 | D u64 |
sizes int32[N] | pointers int64[N] (byte offsets into .bin) | doc_idx int64[D].
Spec: README, "Format 1: the indexed dataset"; upstream facts: README, "The mmap format upstream".
"""

import struct
from pathlib import Path

import numpy as np

from mds_indexed_data.errors import IndexedDatasetError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# magic, version, dtype code, num items, num doc_idx entries
HEADER_STRUCT = struct.Struct("<9sQBQQ")
HEADER_SIZE = HEADER_STRUCT.size  # 34

# Code 7 is float64 in bigscience (our primary reference) and float32 in Microsoft's fork; it never
# holds tokens, so we read it as bigscience does and never write it.
DTYPE_BY_CODE = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float64),
    8: np.dtype(np.uint16),
}
CODE_BY_DTYPE = {dtype: code for code, dtype in sorted(DTYPE_BY_CODE.items(), reverse=True)}


def best_fitting_dtype(vocab_size: int | None) -> np.dtype:
    """Megatron's rule: uint16 when the (unpadded) vocabulary has < 65500 tokens, else int32."""
    if vocab_size is not None and vocab_size < 65500:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def index_file_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.idx")


def data_file_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}.bin")


def dtype_code(dtype: np.dtype) -> int:
    code = CODE_BY_DTYPE.get(np.dtype(dtype))
    if code is None:
        raise ValueError(f"dtype {dtype} has no code in the MMIDIDX format")
    return code


def encode_header(*, dtype: np.dtype, num_items: int, num_doc_idx: int) -> bytes:
    return HEADER_STRUCT.pack(MAGIC, VERSION, dtype_code(dtype), num_items, num_doc_idx)


def decode_header(raw: bytes, path: Path) -> tuple[np.dtype, int, int]:
    """Returns (dtype, num_items, num_doc_idx) or raises IndexedDatasetError naming `path`."""
    if len(raw) < HEADER_SIZE:
        if raw[: len(MAGIC)] != MAGIC[: len(raw)]:
            raise IndexedDatasetError(f"{path}: not a Megatron mmap index (bad magic)")
        raise IndexedDatasetError(
            f"{path}: truncated index ({len(raw)} bytes, the header alone needs {HEADER_SIZE})"
        )
    magic, version, code, num_items, num_doc_idx = HEADER_STRUCT.unpack_from(raw)
    if magic != MAGIC:
        raise IndexedDatasetError(
            f"{path}: not a Megatron mmap index (bad magic {magic!r}, expected {MAGIC!r}); "
            "legacy lazy/cached datasets must be re-preprocessed with --dataset-impl mmap"
        )
    if version != VERSION:
        raise IndexedDatasetError(f"{path}: unsupported index version {version} (only 1 is known)")
    if code not in DTYPE_BY_CODE:
        raise IndexedDatasetError(f"{path}: unknown dtype code {code} (known: 1-8)")
    return DTYPE_BY_CODE[code], num_items, num_doc_idx


def index_file_size(num_items: int, num_doc_idx: int) -> int:
    return HEADER_SIZE + 12 * num_items + 8 * num_doc_idx


# Arrays are checked in slices of this many entries, so that checking a dataset of a billion items
# never allocates more than a few hundred MB.
CHECK_CHUNK = 1 << 24


def check_index_body(
    *,
    sizes: np.ndarray,
    pointers: np.ndarray,
    doc_idx: np.ndarray,
    itemsize: int,
    data_bytes: int,
    index_path: Path,
    data_path: Path,
) -> None:
    """Raises IndexedDatasetError naming the file unless the arrays are what a writer produces:
    sizes >= 0, pointers = exclusive prefix sum of sizes * itemsize, doc_idx starting at 0, never
    decreasing and ending at N, and the `.bin` exactly as long as the items. Vectorised: the 1,000
    items of the golden dataset take 0.1 ms, 10 million about 0.1 s."""
    corrupt = f"{index_path}: corrupt index"
    remedy = "re-create the dataset (or restore its .idx)"
    num_items = len(sizes)
    for start in range(0, num_items, CHECK_CHUNK):
        chunk = sizes[start : start + CHECK_CHUNK]
        if chunk.min() < 0:
            item = start + int(np.argmax(chunk < 0))
            raise IndexedDatasetError(
                f"{corrupt}: item {item} has {int(sizes[item])} tokens (sizes must be >= 0); "
                f"{remedy}"
            )
    if num_items and pointers[0] != 0:
        raise IndexedDatasetError(
            f"{corrupt}: item 0 points to byte {int(pointers[0])} of the .bin, not 0; {remedy}"
        )
    # pointers[i] - pointers[i - 1] == sizes[i - 1] * itemsize, with pointers[0] == 0, is the
    # exclusive prefix sum without computing it (fewer passes over the arrays).
    for start in range(1, num_items, CHECK_CHUNK):
        stop = min(start + CHECK_CHUNK, num_items)
        steps = np.diff(pointers[start - 1 : stop])
        wrong = steps != np.multiply(sizes[start - 1 : stop - 1], itemsize, dtype=np.int64)
        if wrong.any():
            item = start + int(np.argmax(wrong))
            end = int(pointers[item - 1]) + int(sizes[item - 1]) * itemsize
            raise IndexedDatasetError(
                f"{corrupt}: item {item} points to byte {int(pointers[item])} of the .bin, but "
                f"item {item - 1} ends at byte {end}; {remedy}"
            )
    offset = int(pointers[-1]) + int(sizes[-1]) * itemsize if num_items else 0
    if len(doc_idx) == 0:
        if num_items:
            raise IndexedDatasetError(f"{corrupt}: {num_items} items but no doc_idx; {remedy}")
    elif doc_idx[0] != 0 or doc_idx[-1] != num_items:
        raise IndexedDatasetError(
            f"{corrupt}: doc_idx runs from {int(doc_idx[0])} to {int(doc_idx[-1])}, not from 0 to "
            f"the {num_items} items; {remedy}"
        )
    for start in range(0, max(len(doc_idx) - 1, 0), CHECK_CHUNK):
        chunk = doc_idx[start : start + CHECK_CHUNK + 1]
        decreasing = chunk[1:] < chunk[:-1]
        if decreasing.any():
            entry = start + 1 + int(np.argmax(decreasing))
            raise IndexedDatasetError(
                f"{corrupt}: doc_idx decreases at entry {entry} ({int(doc_idx[entry - 1])} -> "
                f"{int(doc_idx[entry])}); {remedy}"
            )
    if data_bytes != offset:
        raise IndexedDatasetError(
            f"{data_path}: data file is {data_bytes} bytes but its index points to {offset}; the "
            f".bin is {'truncated' if data_bytes < offset else 'too long'} or belongs to another "
            "index (re-create the dataset)"
        )


def uncounted_eod_tokens(
    *, sizes: np.ndarray, doc_idx: np.ndarray, itemsize: int, data_bytes: int, tokens
) -> int:
    """How many tokens past the index's end are deepspeedai/Megatron-DeepSpeed's uncounted EODs
    (README: "Uncounted end-of-document tokens"), else 0. Its `preprocess_data.py --append-eod`
    (6acc370a) writes each document's EOD to the .bin but not into the document's last size, so
    the pointers (the sizes' prefix sum) fall one token further behind per document, and the .bin
    is one token per non-empty document longer than the index covers. Told for sure only when
    both hold: that many bytes too many, and every document's true last token (the index's end
    of it, plus one per non-empty document so far) is the same id. `tokens`: the .bin's ids."""
    covered = int(sizes.sum(dtype=np.int64)) * itemsize
    extra_bytes = data_bytes - covered
    if extra_bytes <= 0 or extra_bytes % itemsize or len(doc_idx) < 2:
        return 0
    doc_idx = np.asarray(doc_idx, dtype=np.int64)
    non_empty = np.flatnonzero(doc_idx[1:] > doc_idx[:-1])
    if extra_bytes // itemsize != len(non_empty):
        return 0
    ends = np.zeros(len(sizes) + 1, dtype=np.int64)  # tokens the index counts before item i
    np.cumsum(sizes, dtype=np.int64, out=ends[1:])
    last_tokens = ends[doc_idx[non_empty + 1]] + np.arange(len(non_empty))
    eods = np.asarray(tokens[last_tokens])
    return len(non_empty) if (eods == eods[0]).all() else 0
