"""torch.save's zip format: its records and constants, and `Missing`, the stand-in for classes of
other programs. Follows torch/serialization.py `_save` / `_load` and
caffe2/serialize/inline_container.cc (the zip layout).

A zip archive whose records are all stored (uncompressed) in one folder (torch
names it after the file, without extension; readers take the first record's folder):
  data.pkl            the object, pickled (protocol 2); each tensor is a call of
                      torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
                      requires_grad, backward_hooks) where `storage` is the persistent id
                      ("storage", torch.<Type>Storage, key, location, numel)
  data/<key>          that storage's bytes, little-endian, numel elements of its type
  byteorder           "little" (absent in old files: little)
  version             "3\n"; .format_version "1"; .storage_alignment "64"
  .data/serialization_id   40 digits identifying the file (torch only logs it)
Every record's bytes start at a multiple of 64 in the file: the local header's extra field is
padded (id "FB"), and only the local header's, so data offsets come from local headers.
"""

from __future__ import annotations

import struct
import sys
import types
from collections.abc import Mapping
from typing import Any

ALIGNMENT = 64
FILE_VERSION = "3\n"  # PyTorchStreamWriter's kProducedFileFormatVersion
FORMAT_VERSION = "1"  # storages keyed in order of appearance
LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
LOCAL_HEADER_SIGNATURE = 0x04034B50
STORAGE_DTYPES = {
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "DoubleStorage": "float64",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "UntypedStorage": "uint8",  # storages of dtypes without a legacy class: raw bytes
}


class _MissingClass(type):
    def __getattr__(cls, name: str) -> Missing:
        """A member of the missing class: Python 3.11.2 pickles int enums (DeepSpeed's
        `ZeroStageEnum`) as `getattr(cls, "optimizer_states")`, read as
        `ZeroStageEnum('optimizer_states')`."""
        if name.startswith("_"):  # dunder lookups keep their meaning
            raise AttributeError(name)
        return cls(name)


class Missing(metaclass=_MissingClass):
    """Stands for an object of a class that is not imported here (e.g. `megatron.enums.X`):
    its call arguments (`args`, `kwargs`) and pickled `state`."""

    # Class-level defaults: `copyreg._reconstructor` creates instances with `object.__new__`.
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = types.MappingProxyType({})
    state: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Missing:
        # Protocol 2 rebuilds plain objects with `cls.__new__(cls, *args)` (NEWOBJ) and never
        # calls __init__, so the arguments are recorded here, where both paths pass.
        instance = super().__new__(cls)
        instance.args, instance.kwargs = args, dict(kwargs)
        return instance

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # recorded by __new__

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.args}"


def missing_class(module: str, name: str) -> type:
    return type(name, (Missing,), {"__module__": module, "qualified": f"{module}.{name}"})


def importable(module: str) -> bool:
    """Whether unpickling may import `module`: the standard library and numpy only."""
    top = module.partition(".")[0]
    return top in sys.stdlib_module_names or top in ("numpy", "__builtin__", "copy_reg")
