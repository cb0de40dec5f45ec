"""Writing torch.save's format from numpy arrays without importing torch, one array at a time
(`StreamingSave`) or a whole object (`save`).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import pickle
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..arrays import dtype_name
from .format import ALIGNMENT, FILE_VERSION, FORMAT_VERSION, LOCAL_HEADER, STORAGE_DTYPES, Missing

_ZIP64_LOCAL_EXTRA_BYTES = 20  # zipfile's zip64 extra field in a local header: id, size, sizes
_WRITE_CHUNK_BYTES = 8 << 20  # bounds copies of non-contiguous arrays; 1-64 MiB write alike


class GlobalName:
    """A module's attribute written into a pickle by name (GLOBAL), its module not imported:
    pickle's own check of a global would import torch."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self, *args: Any) -> Any:
        # pickle's save_reduce requires its function to be callable; this one never runs here.
        raise TypeError(f"{self.module}.{self.name} exists only in the pickle")


_REBUILD_TENSOR = GlobalName("torch._utils", "_rebuild_tensor_v2")
_STORAGE_CLASSES = {
    dtype: GlobalName("torch", storage)
    for storage, dtype in STORAGE_DTYPES.items()
    if storage != "UntypedStorage"
}


class _StorageRecord:
    def __init__(self, owner: StreamingSave, key: str, dtype: str, numel: int) -> None:
        self.owner, self.key, self.dtype, self.numel = owner, key, dtype, numel


class SavedTensor:
    """An array already written to the archive; in `close(obj)` it pickles as that tensor."""

    def __init__(self, storage: _StorageRecord, shape: tuple[int, ...]) -> None:
        self.storage, self.shape = storage, shape

    def rebuild_call(self) -> tuple[GlobalName, tuple[Any, ...]]:
        """What torch.save pickles for a C-contiguous tensor of its own storage."""
        stride, step = [], 1
        for length in reversed(self.shape):
            stride.append(step)
            step *= max(length, 1)  # torch's strides of empty dimensions
        hooks = collections.OrderedDict()  # backward hooks, always empty in files
        return _REBUILD_TENSOR, (self.storage, 0, self.shape, tuple(reversed(stride)), False, hooks)

    def __reduce__(self):
        raise TypeError("a SavedTensor pickles only inside StreamingSave.close")


class _ArchivePickler(pickle._Pickler):
    """Protocol 2, as torch.save: arrays become tensors (added to the archive on the way) and
    `GlobalName`s GLOBAL opcodes. The pure-Python pickler, for its dispatch table (speed does
    not matter: the pickle holds metadata only)."""

    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, file: io.BytesIO, archive: StreamingSave) -> None:
        super().__init__(file, protocol=2)
        self._archive = archive

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return self._archive.add(obj).rebuild_call()
        if isinstance(obj, SavedTensor):
            if obj.storage.owner is not self._archive:
                raise ValueError(f"a tensor added to {obj.storage.owner.path}, not to this file")
            return obj.rebuild_call()
        if isinstance(obj, Missing):
            kind = f"{type(obj).__module__}.{type(obj).__name__}"
            raise TypeError(f"cannot save a {kind}: it was read without its module")
        return NotImplemented

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StorageRecord):
            return ("storage", _STORAGE_CLASSES[obj.dtype], obj.key, "cpu", obj.numel)
        return None

    def _save_global_name(self, name: GlobalName) -> None:
        self.write(pickle.GLOBAL + f"{name.module}\n{name.name}\n".encode())
        self.memoize(name)

    dispatch[GlobalName] = _save_global_name


def _byte_chunks(array: np.ndarray) -> Iterator[np.ndarray]:
    """The array's bytes in C order: views of a contiguous array, else copies of a few rows at a
    time (a transposed 1 GB array never needs another 1 GB)."""
    if array.flags.c_contiguous:
        flat = array.reshape(-1).view(np.uint8)
        for start in range(0, flat.size, _WRITE_CHUNK_BYTES):
            yield flat[start : start + _WRITE_CHUNK_BYTES]
        return
    num_rows = max(1, _WRITE_CHUNK_BYTES // array[0].nbytes)
    for start in range(0, array.shape[0], num_rows):
        yield np.ascontiguousarray(array[start : start + num_rows]).reshape(-1).view(np.uint8)


def _archive_folder(path: Path) -> str:
    """torch's folder name: the file's name without its last extension ("archive" if empty)."""
    stem = path.name.rpartition(".")[0] if "." in path.name else path.name
    return f"{stem or 'archive'}/"


class StreamingSave:
    """torch.save's format written one array at a time:
    `with StreamingSave(path) as save: t = save.add(array); ...; save.close({"w": t})`.

    `add` writes the array's bytes at once as `data/K` (handed to the OS: another thread may sync
    the file meanwhile) and returns a placeholder that pickles as that tensor inside `close(obj)`;
    arrays met in `obj` itself are added then. Leaving the `with` without `close` (an exception)
    ends the archive without data.pkl, which no reader takes for a checkpoint."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._folder = _archive_folder(self.path)
        self._file = open(self.path, "wb")  # closed by close() or __exit__
        self._archive = zipfile.ZipFile(self._file, "w", zipfile.ZIP_STORED)
        self._num_storages = 0
        self._descriptor_bytes = 0  # of the record before, had miniz written it
        self._closed = False

    def add(self, array: np.ndarray) -> SavedTensor:
        """Write the array (any layout; a dtype of `arrays.TORCH_DTYPES`) as a new storage."""
        assert not self._closed, "StreamingSave.add after close"
        dtype = dtype_name(array.dtype)
        key = str(self._num_storages)
        self._num_storages += 1
        self._write_record(f"data/{key}", _byte_chunks(array), array.nbytes)
        self._file.flush()
        return SavedTensor(_StorageRecord(self, key, dtype, array.size), tuple(array.shape))

    def close(self, obj: Any) -> None:
        """Pickle `obj` (its arrays and placeholders as tensors) and finish the file."""
        pickled = io.BytesIO()
        _ArchivePickler(pickled, self).dump(obj)
        self._write_text("data.pkl", pickled.getvalue())
        self._write_text(".format_version", FORMAT_VERSION.encode())
        self._write_text(".storage_alignment", str(ALIGNMENT).encode())
        self._write_text("byteorder", b"little")  # TORCH_DTYPES are all little-endian
        self._write_text("version", FILE_VERSION.encode())
        self._write_text(".data/serialization_id", _serialization_id(self._archive.infolist()))
        self._archive.close()
        self._file.close()
        self._closed = True

    def _write_text(self, name: str, data: bytes) -> None:
        self._write_record(name, [data], len(data))

    def _write_record(self, name: str, chunks: Any, num_bytes: int) -> None:
        info = zipfile.ZipInfo(self._folder + name)
        info.compress_type = zipfile.ZIP_STORED
        # Records over zipfile's ZIP64_LIMIT (2 GiB) are zip64: their sizes go into the local
        # header's extra field. Offsets past 4 GiB go into the central directory only.
        zip64 = num_bytes > zipfile.ZIP64_LIMIT
        header_bytes = LOCAL_HEADER.size + len(info.filename.encode("utf-8")) + 4
        header_bytes += _ZIP64_LOCAL_EXTRA_BYTES if zip64 else 0
        # torch.load can compute storage offsets instead of reading local headers (opt-in:
        # torch.utils.serialization.config.load.calculate_storage_offsets), from miniz's layout:
        # a data descriptor (16 bytes, 24 for zip64) after each non-empty record. zipfile writes
        # none (it rewrites the local header instead), so the padding makes up for it: the data
        # land where that computation expects them (for files under 4 GiB whose storages are
        # pickled in the order they were added).
        header_offset = self._file.tell()
        start = header_offset + self._descriptor_bytes
        padding = -(start + header_bytes) % ALIGNMENT + self._descriptor_bytes
        info.extra = b"FB" + struct.pack("<H", padding) + b"Z" * padding  # torch's padding
        with self._archive.open(info, "w", force_zip64=zip64) as record:
            assert self._file.tell() % ALIGNMENT == 0, "record data not aligned"
            for chunk in chunks:
                record.write(chunk)
        info.extra = b""  # the central directory needs no padding (torch's has none)
        if num_bytes == 0:
            self._descriptor_bytes = 0
        else:
            large = max(header_offset, num_bytes) >= 0xFFFFFFFF
            self._descriptor_bytes = 24 if large else 16

    def __enter__(self) -> StreamingSave:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if not self._closed:
            # Errors while ending the partial file (a full disk) would hide the one that got here.
            with contextlib.suppress(OSError, ValueError):
                self._archive.close()
            with contextlib.suppress(OSError, ValueError):
                self._file.close()


def _serialization_id(records: list[zipfile.ZipInfo]) -> bytes:
    """40 digits, as torch's: 20 from the record names, 20 from their CRC-32s."""
    names = hashlib.blake2b("\n".join(sorted(r.filename for r in records)).encode(), digest_size=8)
    crcs = hashlib.blake2b(b"".join(struct.pack("<I", r.CRC) for r in records), digest_size=8)
    digits = [int.from_bytes(h.digest(), "little") for h in (names, crcs)]
    return f"{digits[0]:020d}{digits[1]:020d}".encode()


def save(obj: Any, path: Path) -> None:
    """torch.save(obj, path) with numpy arrays for tensors (each its own storage)."""
    with StreamingSave(path) as archive:
        archive.close(obj)
