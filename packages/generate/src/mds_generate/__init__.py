"""Sampling and zero-shot evaluation for mds GPTs (mds-generate).

Public API (README: "Python API"): `load` a checkpoint or Hugging Face folder, a `Generator`
over it with a `Sampler`, and the configs; `run_eval` for WikiText-103 / LAMBADA.
"""

from .config import EvalConfig, GenerationConfig, ModelSource, SampleConfig, SamplingConfig
from .engine import Completion, Generator
from .evaluation import run_eval
from .loading import LoadedModel, load
from .sampling import Sampler, top_k_filter, top_p_filter
from .tokenizer import TextStream

__all__ = [
    "Completion",
    "EvalConfig",
    "GenerationConfig",
    "Generator",
    "LoadedModel",
    "ModelSource",
    "SampleConfig",
    "Sampler",
    "SamplingConfig",
    "TextStream",
    "load",
    "run_eval",
    "top_k_filter",
    "top_p_filter",
]
