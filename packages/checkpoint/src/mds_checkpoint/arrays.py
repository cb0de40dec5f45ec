"""Numpy stand-ins for the torch dtypes of checkpoints, and the few conversions they need.

Tensors read by `ptfile` are numpy arrays; bfloat16, which numpy lacks, is `BFLOAT16` (the raw
16 bits). `convert` rounds as torch's `.to(dtype)` does on CPU (c10's round-to-nearest-even).
Only `as_tensor` / `as_array` import torch, lazily: for callers that need torch anyway.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# numpy has no bfloat16. A one-field structured dtype is a distinct 2-byte dtype that copies,
# slices, reshapes and np.concatenate's like any other and names itself ("bfloat16") in reprs and
# errors, where a plain uint16 would pass silently for integer data. Arithmetic is refused:
# `to_float32` first.
BFLOAT16 = np.dtype([("bfloat16", "<u2")])

TORCH_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": BFLOAT16,
    "float64": np.dtype("<f8"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}

_FLOAT_NAMES = ("float32", "float16", "bfloat16")
_BFLOAT16_NAN = 0x7FC0  # c10::BFloat16's NaN (its scalar round_to_nearest_even)


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a torch dtype name ("float32", "bfloat16", ...)."""
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {name!r}") from None


def dtype_name(dtype: np.dtype) -> str:
    """The torch dtype name of a numpy dtype of `TORCH_DTYPES` (little-endian only)."""
    for name, candidate in TORCH_DTYPES.items():
        if dtype == candidate:
            return name
    raise ValueError(f"unsupported array dtype {dtype} (no torch dtype stands for it)")


def _float_name(a: np.ndarray) -> str:
    name = dtype_name(a.dtype)
    if name not in _FLOAT_NAMES:
        raise ValueError(f"expected a float32, float16 or bfloat16 array, got {name}")
    return name


def to_float32(a: np.ndarray) -> np.ndarray:
    """float32 values of a float32 / float16 / BFLOAT16 array (float32 itself: no copy)."""
    name = _float_name(a)
    if name == "float32":
        return a
    if name == "float16":
        return a.astype(np.float32)
    # bfloat16 is the upper half of a float32: exact.
    return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def convert(a: np.ndarray, name: str) -> np.ndarray:
    """A float32 / float16 / BFLOAT16 array as dtype `name` ("float32", "float16" or
    "bfloat16"), rounded to nearest even like torch's `.to()`; the array itself if already so."""
    if name not in _FLOAT_NAMES:
        raise ValueError(f"cannot convert to {name!r}: expected float32, float16 or bfloat16")
    if _float_name(a) == name:
        return a
    values = to_float32(a)
    if name == "float32":
        return values
    if name == "float16":
        with np.errstate(over="ignore"):  # overflow to inf is the rounding's result, as in torch
            return values.astype(np.float16)  # IEEE round to nearest even, as torch
    bits = values.view(np.uint32)
    rounded = (bits >> 16) & 1  # the kept part's lowest bit decides ties (to even)
    rounded += 0x7FFF
    rounded += bits  # carries into the upper half when the dropped half rounds up
    rounded >>= 16
    result = rounded.astype(np.uint16)
    result[np.isnan(values)] = _BFLOAT16_NAN  # the carry would corrupt NaN payloads
    return result.view(BFLOAT16)


def _unsigned_view(a: np.ndarray) -> np.ndarray:
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bytes (NaNs compare by bits; any memory layout)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(_unsigned_view(a), _unsigned_view(b)))


def as_tensor(a: np.ndarray) -> Any:
    """A torch tensor sharing the array's memory (BFLOAT16 -> torch.bfloat16)."""
    import torch  # lazy: only callers that build models or export need torch

    if a.dtype == BFLOAT16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def as_array(tensor: Any) -> np.ndarray:
    """A numpy array sharing a CPU copy of the tensor's memory (torch.bfloat16 -> BFLOAT16)."""
    import torch  # lazy: the argument is a tensor, so torch is loaded already

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BFLOAT16)
    return tensor.numpy()
