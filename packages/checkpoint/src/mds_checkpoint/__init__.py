"""The checkpoint layout of mds: read any TP/PP/DP layout, reshape it, export to Hugging Face.

Public API (README: "Python API"): `load_consolidated` and `ConsolidatedModel` give any
checkpoint as one TP=1 model; the reshaper and the Hugging Face converters are `mds-merge-mp`'s.
"""

from .consolidate import ConsolidatedModel, load_consolidated

__all__ = ["ConsolidatedModel", "load_consolidated"]
