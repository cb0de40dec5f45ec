"""torch.load of DeepSpeed rank files that other programs wrote.

Upstream's `args` pickle Megatron's enums (`megatron.core.enums.ModelType`), which do not import
here; every load of a whole rank file, mds's own or DeepSpeed's engine's, reads such classes as
inert records (ptfile's `FOREIGN_CLASSES_PICKLE`) and every importable class as itself.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from mds_checkpoint import FOREIGN_CLASSES_PICKLE

from .deepspeed_engine import checkpoint_engine_loading_with


def load_rank_file(path: str | Path, map_location: Any = "cpu", *, mmap: bool = False) -> Any:
    return torch.load(
        path,
        map_location=map_location,
        weights_only=False,
        mmap=mmap,
        pickle_module=FOREIGN_CLASSES_PICKLE,
    )


def unpickling_foreign_classes(engine: Any) -> AbstractContextManager[None]:
    """For a load through DeepSpeed's engine: its checkpoint engine's torch.load is
    `load_rank_file`."""
    return checkpoint_engine_loading_with(engine, load_rank_file)
