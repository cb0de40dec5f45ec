"""The checkpoint layout of mds: read any TP/PP/DP layout, reshape it, export to Hugging Face.

Public API (README: "Python API"): `load_consolidated` and `ConsolidatedModel` give any
checkpoint as one TP=1 model; `check_model_flags` checks a command line's model flags against
it; `UniversalState` and `plain_parameter_name` let a trainer at any
topology take its slices of a reshaped checkpoint's optimizer state (mds-train's resume). They
load (and torch with them) on first use, so `mds-merge-mp --help` does not wait for torch.
"""

from typing import TYPE_CHECKING

from mds_common.lazy import lazy_attributes

if TYPE_CHECKING:
    from .consolidate import ConsolidatedModel, load_consolidated
    from .describe import check_model_flags
    from .engine_names import plain_parameter_name
    from .universal import UniversalState

_MODULE_OF = {
    "ConsolidatedModel": "consolidate",
    "load_consolidated": "consolidate",
    "check_model_flags": "describe",
    "plain_parameter_name": "engine_names",
    "UniversalState": "universal",
}

__all__ = [
    "ConsolidatedModel",
    "UniversalState",
    "check_model_flags",
    "load_consolidated",
    "plain_parameter_name",
]


__getattr__, __dir__ = lazy_attributes(__name__, _MODULE_OF)
