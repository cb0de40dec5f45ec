"""Tensor/pipeline-parallel GPT layers in Megatron-DeepSpeed's layout, with fused Triton kernels.

The names below are the library's public API (documented in the package README, "Python API");
the trainer, the checkpoint reshaper and the sampler import them from here. The pipeline names
import DeepSpeed, so they load on first use and `import mds_model` stays light.
"""

from .attention import KVCache, LayerKVCache, StaticKVCache, StaticLayerCache
from .config import GPTConfig, padded_vocab_size
from .estimate import (
    Plan,
    activation_bytes_per_layer,
    embedding_parameters,
    estimate,
    flops_per_token,
    format_estimate,
    layer_parameters,
    total_parameters,
)
from .gpt import GPT, lm_losses, masked_mean
from .hf import from_hf_gpt2_state_dict, hf_gpt2_config, to_hf_gpt2_state_dict
from .parallel import ParallelGroups
from .rng import RNGStatesTracker, model_parallel_seed

_PIPELINE_NAMES = ("PipeLoss", "build_gpt_pipe", "gpt_layer_specs", "pipeline_deepspeed_config")

__all__ = [
    "GPT",
    "GPTConfig",
    "KVCache",
    "LayerKVCache",
    "ParallelGroups",
    "PipeLoss",
    "Plan",
    "RNGStatesTracker",
    "StaticKVCache",
    "StaticLayerCache",
    "activation_bytes_per_layer",
    "build_gpt_pipe",
    "embedding_parameters",
    "estimate",
    "flops_per_token",
    "format_estimate",
    "from_hf_gpt2_state_dict",
    "gpt_layer_specs",
    "hf_gpt2_config",
    "layer_parameters",
    "lm_losses",
    "masked_mean",
    "model_parallel_seed",
    "padded_vocab_size",
    "pipeline_deepspeed_config",
    "to_hf_gpt2_state_dict",
    "total_parameters",
]


def __getattr__(name: str):
    if name in _PIPELINE_NAMES:
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'mds_model' has no attribute {name!r}")
