"""Reading `torch.save` files of other programs: memory-mapped, and tolerant of their classes.

Megatron's `args` pickle Megatron's own enums, DeepSpeed's files its loss scalers and fragment
addresses; a class that does not import here becomes a `Missing` record of its name and
arguments instead of failing the whole load. Tensors are memory-mapped (`mmap=True`), so reading
one layer from a file holding a whole stage touches only that layer's pages.
"""

from __future__ import annotations

import pickle
import types
import zipfile
from pathlib import Path
from typing import Any

import torch


class Missing:
    """Stands for an object of a class that is not importable here (e.g. `megatron.enums.X`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.args}"


def _missing_class(module: str, name: str) -> type:
    return type(name, (Missing,), {"__module__": module, "qualified": f"{module}.{name}"})


class _TolerantUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return _missing_class(module, name)


tolerant_pickle = types.SimpleNamespace(
    Unpickler=_TolerantUnpickler, load=pickle.load, __name__="mds_checkpoint_tolerant_pickle"
)


def load(path: Path, *, mmap: bool = True) -> Any:
    """`torch.load` on CPU, memory-mapped where the file's format allows it."""
    try:
        return torch.load(
            path,
            map_location="cpu",
            mmap=mmap and zipfile.is_zipfile(path),  # legacy (pre-1.6) files cannot be mapped
            weights_only=False,  # checkpoints pickle arguments and optimizer records
            pickle_module=tolerant_pickle,
        )
    except FileNotFoundError:
        raise ValueError(f"{path}: missing file") from None
    except (RuntimeError, pickle.UnpicklingError, EOFError, OSError) as error:
        raise ValueError(f"{path}: not a readable torch checkpoint file ({error})") from None
