"""The checkpoint layout of mds: read any TP/PP/DP layout, reshape it, export to Hugging Face.

Public API (README: "Python API"): `load_consolidated` and `ConsolidatedModel` give any
checkpoint as one TP=1 model; `check_model_flags` checks a command line's model flags against
it; `UniversalState` and `plain_parameter_name` let a trainer at any topology take its slices of a
reshaped checkpoint's optimizer state (mds-train's resume); `locate_checkpoint` says which
checkpoint folder a path means (for mds-train's --load as for this package's tools; not `locate`,
which the submodule's name would shadow once imported). They load (and torch with them) on first
use, so `mds-merge-mp --help` does not wait for torch.
"""

from typing import TYPE_CHECKING

from mds_common.lazy import lazy_attributes

if TYPE_CHECKING:
    from .consolidate import ConsolidatedModel, load_consolidated
    from .describe import check_model_flags
    from .engine_names import plain_parameter_name
    from .locate import Located, locate_checkpoint
    from .universal import UniversalState

_MODULE_OF = {
    "ConsolidatedModel": "consolidate",
    "load_consolidated": "consolidate",
    "check_model_flags": "describe",
    "plain_parameter_name": "engine_names",
    "Located": "locate",
    "locate_checkpoint": "locate",
    "UniversalState": "universal",
}

__all__ = [
    "ConsolidatedModel",
    "Located",
    "UniversalState",
    "check_model_flags",
    "load_consolidated",
    "locate_checkpoint",
    "plain_parameter_name",
]


__getattr__, __dir__ = lazy_attributes(__name__, _MODULE_OF)
