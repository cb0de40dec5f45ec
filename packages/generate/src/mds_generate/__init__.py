"""Sampling and zero-shot evaluation for mds GPTs (mds-generate).

Public API (README: "Python API"): `load` a checkpoint or Hugging Face folder, a `Generator`
over it with a `Sampler`, and the configs; `run_eval` for WikiText-103 / LAMBADA. The names load
on first use, so that `mds-generate --help` and `--version` start without loading torch.
"""

from typing import TYPE_CHECKING

from mds_common.lazy import lazy_attributes

if TYPE_CHECKING:
    from .config import EvalConfig, GenerationConfig, ModelSource, SampleConfig, SamplingConfig
    from .engine import Completion, Generator
    from .evaluation import run_eval
    from .loading import LoadedModel, load
    from .sampling import Sampler, top_k_filter, top_p_filter
    from .tokenizer import TextStream

_LAZY = {
    "config": ("EvalConfig", "GenerationConfig", "ModelSource", "SampleConfig", "SamplingConfig"),
    "engine": ("Completion", "Generator"),
    "evaluation": ("run_eval",),
    "loading": ("LoadedModel", "load"),
    "sampling": ("Sampler", "top_k_filter", "top_p_filter"),
    "tokenizer": ("TextStream",),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

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


__getattr__, __dir__ = lazy_attributes(__name__, _MODULE_OF)
