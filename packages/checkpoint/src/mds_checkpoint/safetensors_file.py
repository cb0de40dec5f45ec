"""Reading a `.safetensors` file one tensor at a time into fresh numpy arrays.

The format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of JSON
({name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__"}), then the
tensors' bytes, offsets counted from the end of the header. Each tensor is read with one
`readinto` instead of through a mapping of the whole file: a mapping's touched pages count in the
reader's resident memory until it is closed, so import-hf of a 1.4 GB model peaked at 2 GB with
`safetensors.safe_open` (one part converted at a time); read this way, only the parts held count.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .arrays import numpy_dtype

_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
_MAX_HEADER_BYTES = 100 << 20  # the format's own limit


@dataclass(frozen=True)
class StoredTensor:
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int  # byte offset in the file
    num_bytes: int


def read_header(path: Path) -> dict[str, StoredTensor]:
    """The file's tensors by name, in the header's order; ValueError for a malformed file."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        prefix = file.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
        (header_bytes,) = struct.unpack("<Q", prefix)
        if header_bytes > min(_MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{path}: not a safetensors file (header length {header_bytes})")
        try:
            header = json.loads(file.read(header_bytes))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: not a safetensors file (header: {error})") from None
    data_start = 8 + header_bytes
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = numpy_dtype(_DTYPES[entry["dtype"]])
            shape = tuple(int(n) for n in entry["shape"])
            begin, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: {name} has an unreadable header entry {entry}") from None
        if end - begin != math.prod(shape) * dtype.itemsize or data_start + end > size:
            raise ValueError(f"{path}: {name}'s bytes {begin}..{end} do not fit its shape or file")
        tensors[name] = StoredTensor(dtype, shape, data_start + begin, end - begin)
    return tensors


def read_tensor(path: Path, tensor: StoredTensor) -> np.ndarray:
    """One tensor's values, in memory of its own."""
    array = np.empty(tensor.shape, dtype=tensor.dtype)
    with open(path, "rb") as file:
        file.seek(tensor.start)
        if file.readinto(memoryview(array.reshape(-1).view(np.uint8))) != tensor.num_bytes:
            raise ValueError(f"{path}: truncated inside a tensor's bytes")
    return array
