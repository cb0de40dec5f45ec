"""Constants and header codec of Megatron's mmap indexed dataset (`MMIDIDX`, version 1).

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
