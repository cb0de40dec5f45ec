"""Reading a torch.save file into numpy arrays, memory-mapped, without importing torch or the
modules of the classes it pickles (those become `Missing` records). Only legacy (pre-1.6) files
need torch.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import math
import mmap
import pickle
import struct
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import as_array, numpy_dtype
from .format import (
    LOCAL_HEADER,
    LOCAL_HEADER_SIGNATURE,
    STORAGE_DTYPES,
    Missing,
    importable,
    missing_class,
)

_STORAGE_MODULES = ("torch", "torch.cuda", "torch.storage")
# torch.dtype pickles as the global `torch.<name>` (its __reduce__ returns the name).
_TORCH_DTYPE_NAMES = frozenset(
    "bfloat16 bool complex32 complex64 complex128 float16 float32 float64 float8_e4m3fn "
    "float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn_x2 int8 int16 "
    "int32 int64 uint8 uint16 uint32 uint64 qint8 qint32 quint8 quint2x4 quint4x2".split()
)


def _is_contiguous(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for length, step in zip(reversed(size), reversed(stride), strict=True):
        if length != 1 and step != expected:
            return False
        expected *= length
    return True


def _rebuild_tensor(storage, storage_offset, size, stride, *_hooks_and_metadata) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 (and v1): the tensor as a view of its storage's array."""
    size, stride = tuple(size), tuple(stride)
    if len(stride) != len(size):
        raise ValueError(f"a tensor of size {size} has stride {stride}")
    numel = math.prod(size)
    if numel == 0:
        return storage[:0].reshape(size)
    last = storage_offset + sum(
        (length - 1) * step for length, step in zip(size, stride, strict=True)
    )
    if min(stride, default=0) < 0 or last >= storage.size:
        raise ValueError(
            f"a tensor of size {size}, stride {stride} at offset {storage_offset} overruns "
            f"its storage of {storage.size} elements"
        )
    if _is_contiguous(size, stride):
        return storage[storage_offset : storage_offset + numel].reshape(size)
    strides = tuple(step * storage.itemsize for step in stride)
    return np.lib.stride_tricks.as_strided(storage[storage_offset:], size, strides)


def _rebuild_parameter(data, _requires_grad, _backward_hooks, _state=None) -> np.ndarray:
    return data  # nn.Parameter: the tensor itself


def _rebuild_from_type(func, _new_type, args, _state) -> Any:
    return func(*args)  # a tensor subclass or a tensor with Python attributes: the tensor


def _device(kind: str, index: int | None = None) -> str:
    return kind if index is None else f"{kind}:{index}"


_TORCH_GLOBALS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type,
    ("torch.tensor", "_rebuild_from_type_v2"): _rebuild_from_type,  # torch < 1.10
    ("torch._utils", "_rebuild_from_type"): _rebuild_from_type,
    ("torch", "Size"): tuple,
    ("torch", "device"): _device,
}


class _MappedStorages:
    """The `data/<key>` records of an archive as flat arrays over one private mapping of the file
    (copy-on-write: the arrays are writable, and writes never reach the file)."""

    def __init__(self, mapping: mmap.mmap, records: dict[str, zipfile.ZipInfo]) -> None:
        self._mapping, self._records = mapping, records
        self._arrays: dict[str, np.ndarray] = {}  # tensors sharing a storage share its array

    def array(self, key: str, dtype: np.dtype, numel: int) -> np.ndarray:
        if key not in self._arrays:
            record = self._records.get(f"data/{key}")
            if record is None:
                raise ValueError(f"record data/{key} is missing")
            if numel * dtype.itemsize > record.file_size:
                raise ValueError(f"record data/{key} is shorter than its {numel} elements")
            offset = _data_offset(self._mapping, record)
            self._arrays[key] = np.frombuffer(self._mapping, dtype, numel, offset)
        return self._arrays[key]


def _data_offset(mapping: mmap.mmap, record: zipfile.ZipInfo) -> int:
    """Where a record's bytes start: after its local header, whose extra field (torch's padding)
    differs from the central directory's."""
    fields = LOCAL_HEADER.unpack_from(mapping, record.header_offset)
    if fields[0] != LOCAL_HEADER_SIGNATURE:
        raise ValueError(f"record {record.filename} has no local header")
    name_length, extra_length = fields[-2:]
    return record.header_offset + LOCAL_HEADER.size + name_length + extra_length


class _ArchiveUnpickler(pickle.Unpickler):
    """data.pkl's unpickler: storages from the mapping, torch's globals as numpy equivalents,
    any module other than the standard library's and numpy's as `Missing` classes."""

    def __init__(self, pickled: bytes, storages: _MappedStorages) -> None:
        super().__init__(io.BytesIO(pickled), encoding="utf-8")  # torch.load's encoding
        self._storages = storages
        self._missing_classes: dict[tuple[str, str], type] = {}

    def persistent_load(self, pid: Any) -> np.ndarray:
        kind, storage_dtype, key, _location, numel = pid
        if kind not in ("storage", b"storage"):
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        if not isinstance(storage_dtype, np.dtype):
            raise pickle.UnpicklingError(f"unsupported storage type {storage_dtype!r}")
        key = key.decode("ascii") if isinstance(key, bytes) else key
        return self._storages.array(key, storage_dtype, numel)

    def find_class(self, module: str, name: str) -> Any:
        known = _TORCH_GLOBALS.get((module, name))
        if known is not None:
            return known
        if module in _STORAGE_MODULES and name in STORAGE_DTYPES:
            return numpy_dtype(STORAGE_DTYPES[name])
        if module == "torch" and name in _TORCH_DTYPE_NAMES:
            return f"torch.{name}"
        if importable(module):
            with contextlib.suppress(ImportError, AttributeError):
                return super().find_class(module, name)
        if (module, name) not in self._missing_classes:
            self._missing_classes[module, name] = missing_class(module, name)
        return self._missing_classes[module, name]


# How a damaged or foreign file fails somewhere in zipfile, the pickle or the tensor rebuilds.
_UNREADABLE = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    pickle.UnpicklingError,
    EOFError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    struct.error,
    OSError,
)


def load(path: Path) -> Any:
    """The object of a torch.save file, with every tensor a numpy array (memory-mapped)."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            if _is_archive(file):
                return _load_archive(file)
    except FileNotFoundError:
        raise ValueError(f"{path}: missing file") from None
    except _UNREADABLE as error:
        raise _unreadable(path, error) from None
    return _load_legacy(path)


def check(path: Path) -> None:
    """Raises `load`'s one-line ValueError when `path` is not a whole torch.save file, reading
    only the zip directory and its records' names (a file cut short has no directory): cheap
    enough for every file of a checkpoint before a trainer loads it."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            if _is_archive(file):
                with zipfile.ZipFile(file) as archive:
                    _archive_records(archive)
    except FileNotFoundError:
        raise ValueError(f"{path}: missing file") from None
    except _UNREADABLE as error:
        raise _unreadable(path, error) from None


def _is_archive(file: io.BufferedReader) -> bool:
    """A zip archive (torch >= 1.6) or a legacy pickle; anything else is unreadable."""
    if zipfile.is_zipfile(file):
        return True
    file.seek(0)
    start = file.read(4)
    if start == struct.pack("<I", LOCAL_HEADER_SIGNATURE):
        size = file.seek(0, io.SEEK_END)
        raise ValueError(
            f"a zip archive without its directory: the file is cut short at {size:,} bytes"
        )
    if start[:1] != pickle.PROTO:
        raise ValueError("neither a zip archive nor a pickle")
    return False


def _unreadable(path: Path, error: BaseException) -> ValueError:
    message = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return ValueError(f"{path}: not a readable torch checkpoint file ({message})")


def _archive_records(archive: zipfile.ZipFile) -> tuple[str, dict[str, zipfile.ZipInfo]]:
    """The archive's folder and its records by name, checked to be torch.save's."""
    infos = archive.infolist()
    if not infos or "/" not in infos[0].filename:
        raise ValueError("the archive has no folder of records")
    folder = infos[0].filename.partition("/")[0] + "/"
    records = {
        info.filename[len(folder) :]: info for info in infos if info.filename.startswith(folder)
    }
    if "data.pkl" not in records:
        raise ValueError(f"the archive has no {folder}data.pkl")
    for name, info in records.items():
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"record {name} is compressed (torch.save stores records)")
    return folder, records


def _load_archive(file: io.BufferedReader) -> Any:
    with zipfile.ZipFile(file) as archive:
        folder, records = _archive_records(archive)
        byteorder = archive.read(folder + "byteorder") if "byteorder" in records else b"little"
        if byteorder != b"little":
            raise ValueError(f"its byte order is {byteorder[:16]!r}; only little-endian is read")
        pickled = archive.read(folder + "data.pkl")
    # Python >= 3.13 can map without keeping a duplicate descriptor open per mapped file.
    untracked = {"trackfd": False} if sys.version_info >= (3, 13) else {}
    mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY, **untracked)
    return _ArchiveUnpickler(pickled, _MappedStorages(mapping, records)).load()


class _TolerantUnpickler(pickle.Unpickler):
    """For torch.load of legacy files: torch's and the importable classes real, others Missing."""

    def find_class(self, module: str, name: str) -> Any:
        if module.partition(".")[0] == "torch" or importable(module):
            with contextlib.suppress(ImportError, AttributeError):
                return super().find_class(module, name)
        return missing_class(module, name)


_TOLERANT_PICKLE = types.SimpleNamespace(
    Unpickler=_TolerantUnpickler, load=pickle.load, __name__="mds_checkpoint_tolerant_pickle"
)


class _ForeignClassesUnpickler(pickle.Unpickler):
    """Every class whose module imports is itself; a class of a program not installed here
    (Megatron's enums in upstream's `args`) is a `Missing` record instead of an ImportError."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return missing_class(module, name)


# torch.load's `pickle_module` for whole files of other programs (DeepSpeed's loader on
# upstream's rank files).
FOREIGN_CLASSES_PICKLE = types.SimpleNamespace(
    Unpickler=_ForeignClassesUnpickler, load=pickle.load, __name__="mds_checkpoint_foreign_pickle"
)


def _load_legacy(path: Path) -> Any:
    """A pre-1.6 file (a sequence of pickles, not a zip archive): only torch reads it."""
    import torch

    try:
        loaded = torch.load(
            path, map_location="cpu", weights_only=False, pickle_module=_TOLERANT_PICKLE
        )
    except (RuntimeError, *_UNREADABLE) as error:
        raise _unreadable(path, error) from None
    return _without_torch(loaded, torch)


def _without_torch(value: Any, torch: Any) -> Any:
    """`value` with torch's objects as the zip reader gives them (arrays, strings, tuples)."""

    def plain(item: Any) -> Any:
        return _without_torch(item, torch)

    if isinstance(value, torch.Tensor):
        return as_array(value)
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, dict):
        items = {key: plain(item) for key, item in value.items()}
        return (
            collections.OrderedDict(items) if isinstance(value, collections.OrderedDict) else items
        )
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, tuple):
        items = [plain(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, argparse.Namespace):
        return argparse.Namespace(**plain(vars(value)))
    if isinstance(value, Missing):
        value.args, value.state = plain(value.args), plain(value.state)
    return value
