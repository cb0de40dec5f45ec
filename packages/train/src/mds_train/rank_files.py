"""torch.load of DeepSpeed rank files that other programs wrote.

Upstream's `args` pickle Megatron's enums (`megatron.core.enums.ModelType`), which do not import
here; every load of a whole rank file, mds's own or DeepSpeed's engine's, reads such classes as
inert records (ptfile's `FOREIGN_CLASSES_PICKLE`) and every importable class as itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from mds_checkpoint.ptfile import FOREIGN_CLASSES_PICKLE


def load_rank_file(path: str | Path, map_location: Any = "cpu", *, mmap: bool = False) -> Any:
    return torch.load(
        path,
        map_location=map_location,
        weights_only=False,
        mmap=mmap,
        pickle_module=FOREIGN_CLASSES_PICKLE,
    )


@contextmanager
def unpickling_foreign_classes(engine: Any) -> Iterator[None]:
    """For a load through DeepSpeed's engine: its checkpoint engine's torch.load is
    `load_rank_file`."""
    checkpoint_engine = engine.checkpoint_engine
    original = checkpoint_engine.load

    def load(path: str, map_location: Any = None) -> Any:
        return load_rank_file(path, map_location)

    checkpoint_engine.load = load
    try:
        yield
    finally:
        checkpoint_engine.load = original
