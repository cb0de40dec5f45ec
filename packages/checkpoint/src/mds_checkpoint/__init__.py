"""The checkpoint layout of mds: read any TP/PP/DP layout, reshape it, export to Hugging Face.

Public API (README: "Python API"): `load_consolidated` and `ConsolidatedModel` give any
checkpoint as one TP=1 model; `UniversalState` and `plain_parameter_name` let a trainer at any
topology take its slices of a reshaped checkpoint's optimizer state (mds-train's resume).
"""

from .consolidate import ConsolidatedModel, load_consolidated
from .engine_names import plain_parameter_name
from .universal import UniversalState

__all__ = ["ConsolidatedModel", "UniversalState", "load_consolidated", "plain_parameter_name"]
