"""Tensor/pipeline-parallel GPT layers in Megatron-DeepSpeed's layout, with fused Triton kernels.

The names below are the library's public API (documented in the package README, "Python API");
the trainer, the checkpoint reshaper and the sampler import them from here. Only the config and
the size arithmetic load with the package; the modules (and Triton's kernels, and DeepSpeed for the
pipeline names) load on first use, so a tool that needs only `GPTConfig` (mds-merge-mp) does not
pay for them at start-up.
"""

from typing import TYPE_CHECKING

from mds_common.lazy import lazy_attributes

from .config import GPTConfig, check_tensor_parallel, for_tensor_parallel, padded_vocab_size
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

if TYPE_CHECKING:
    from .decoding import Decoder, KVCache, LayerKVCache, StaticKVCache, StaticLayerCache
    from .gpt import GPT, lm_losses, masked_mean
    from .hf import (
        from_hf_gpt2_parts,
        from_hf_gpt2_state_dict,
        gpt2_problem,
        hf_gpt2_config,
        to_hf_gpt2_state_dict,
    )
    from .hf_families import (
        HF_ADAPTERS,
        HFAdapter,
        hf_adapter,
        hf_adapter_of_folder,
        hf_problem,
    )
    from .parallel import ParallelGroups
    from .pipeline import PipeLoss, build_gpt_pipe, gpt_layer_specs, pipeline_deepspeed_config
    from .rng import RNGStatesTracker, model_parallel_seed

_LAZY = {
    "decoding": ("Decoder", "KVCache", "LayerKVCache", "StaticKVCache", "StaticLayerCache"),
    "gpt": ("GPT", "lm_losses", "masked_mean"),
    "hf": (
        "from_hf_gpt2_parts",
        "from_hf_gpt2_state_dict",
        "gpt2_problem",
        "hf_gpt2_config",
        "to_hf_gpt2_state_dict",
    ),
    "hf_families": ("HF_ADAPTERS", "HFAdapter", "hf_adapter", "hf_adapter_of_folder", "hf_problem"),
    "parallel": ("ParallelGroups",),
    "pipeline": ("PipeLoss", "build_gpt_pipe", "gpt_layer_specs", "pipeline_deepspeed_config"),
    "rng": ("RNGStatesTracker", "model_parallel_seed"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "Decoder",
    "GPT",
    "GPTConfig",
    "HFAdapter",
    "HF_ADAPTERS",
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
    "check_tensor_parallel",
    "embedding_parameters",
    "estimate",
    "flops_per_token",
    "for_tensor_parallel",
    "format_estimate",
    "from_hf_gpt2_parts",
    "from_hf_gpt2_state_dict",
    "gpt2_problem",
    "gpt_layer_specs",
    "hf_adapter",
    "hf_adapter_of_folder",
    "hf_gpt2_config",
    "hf_problem",
    "layer_parameters",
    "lm_losses",
    "masked_mean",
    "model_parallel_seed",
    "padded_vocab_size",
    "pipeline_deepspeed_config",
    "to_hf_gpt2_state_dict",
    "total_parameters",
]


__getattr__, __dir__ = lazy_attributes(__name__, _MODULE_OF)
