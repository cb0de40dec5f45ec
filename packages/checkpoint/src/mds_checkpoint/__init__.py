"""The checkpoint layout of mds: read any TP/PP/DP layout, reshape it, export to Hugging Face.

Public API (README: "Python API"): `load_consolidated` and `ConsolidatedModel` give any
checkpoint as one TP=1 model; `UniversalState` and `plain_parameter_name` let a trainer at any
topology take its slices of a reshaped checkpoint's optimizer state (mds-train's resume). They
load (and torch with them) on first use, so `mds-merge-mp --help` does not wait for torch.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .consolidate import ConsolidatedModel, load_consolidated
    from .engine_names import plain_parameter_name
    from .universal import UniversalState

_MODULE_OF = {
    "ConsolidatedModel": "consolidate",
    "load_consolidated": "consolidate",
    "plain_parameter_name": "engine_names",
    "UniversalState": "universal",
}

__all__ = ["ConsolidatedModel", "UniversalState", "load_consolidated", "plain_parameter_name"]


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'mds_checkpoint' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
