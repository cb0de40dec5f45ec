"""Fused Triton kernels of mds_model, each with a pure-torch reference that is also the CPU path.

Every function takes `use_kernel`: True runs the Triton kernel (CUDA, or the CPU interpreter under
TRITON_INTERPRET=1), False the reference. The model passes its config's switch; nothing is patched.
"""

from ._common import triton_available
from .bias_gelu import bias_gelu
from .cross_entropy import vocab_parallel_cross_entropy
from .layer_norm import add_layer_norm
from .rms_norm import add_rms_norm
from .rotary import rotary_qkv, rotary_qkv_into_cache
from .skinny_linear import MAX_FUSED_NORM_WIDTH, skinny_add_norm_linear, skinny_linear
from .softmax import scaled_masked_softmax
from .swiglu import swiglu

__all__ = [
    "MAX_FUSED_NORM_WIDTH",
    "add_layer_norm",
    "add_rms_norm",
    "bias_gelu",
    "rotary_qkv",
    "rotary_qkv_into_cache",
    "scaled_masked_softmax",
    "skinny_add_norm_linear",
    "skinny_linear",
    "swiglu",
    "triton_available",
    "vocab_parallel_cross_entropy",
]
