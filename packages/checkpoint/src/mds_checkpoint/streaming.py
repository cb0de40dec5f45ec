"""`torch.save`'s zip format written one tensor at a time, so a whole-model file (the plain
engine's `mp_rank_XX_model_states.pt`) never needs the whole model in memory.

Each tensor's bytes go into the archive as `data/K` when it is added; `close(obj)` pickles the
object last, with every added tensor standing for a `_rebuild_tensor_v2` of storage K, exactly as
`torch.save` pickles it. `torch.load` (memory-mapped too) reads the result like any other file.
"""

from __future__ import annotations

import collections
import io
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
from torch.serialization import _get_storage_alignment


class _Storage:
    """What the pickle refers to instead of a real storage (persistent id)."""

    def __init__(self, key: str, storage_type: type, numel: int) -> None:
        self.key, self.storage_type, self.numel = key, storage_type, numel


class SavedTensor:
    """A tensor already written to the archive; pickles as torch.save pickles a tensor."""

    def __init__(self, storage: _Storage, shape: torch.Size, stride: tuple[int, ...]) -> None:
        self.storage, self.shape, self.stride = storage, shape, stride

    def __reduce_ex__(self, protocol: int):
        args = (self.storage, 0, self.shape, self.stride, False, collections.OrderedDict())
        return torch._utils._rebuild_tensor_v2, args


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any):
        if isinstance(obj, _Storage):
            return ("storage", obj.storage_type, obj.key, "cpu", obj.numel)
        if isinstance(obj, torch.Tensor):
            raise TypeError("add tensors with StreamingSave.add before close()")
        return None


class StreamingSave:
    """`with StreamingSave(path) as save: t = save.add(tensor) ...; save.close({"w": t})`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = torch._C.PyTorchFileWriter(str(path))
        self._count = 0
        self._closed = False

    def add(self, tensor: torch.Tensor) -> SavedTensor:
        tensor = tensor.detach().cpu().contiguous()
        num_bytes = tensor.numel() * tensor.element_size()
        storage = tensor.untyped_storage()
        start = tensor.storage_offset() * tensor.element_size()
        if start or storage.nbytes() != num_bytes:
            storage = storage[start : start + num_bytes]  # a view: its own bytes, not copied
        key = str(self._count)
        self._count += 1
        self._writer.write_record(f"data/{key}", storage, num_bytes)
        typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=tensor.dtype, _internal=True)
        storage_type = getattr(torch, typed._pickle_storage_type())
        return SavedTensor(
            _Storage(key, storage_type, tensor.numel()), tensor.shape, tensor.stride()
        )

    def close(self, obj: Any) -> None:
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=2).dump(obj)
        data = buffer.getvalue()
        self._writer.write_record("data.pkl", data, len(data))
        self._writer.write_record(".format_version", "1", 1)
        alignment = str(_get_storage_alignment())
        self._writer.write_record(".storage_alignment", alignment, len(alignment))
        self._writer.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        self._writer.write_end_of_file()
        self._closed = True

    def __enter__(self) -> StreamingSave:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if not self._closed:
            del self._writer  # an exception: the partial file is removed with its folder
