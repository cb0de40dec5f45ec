"""A decoding step's projections: one row at TP=1 in half precision on CUDA runs the skinny
Triton kernels (`kernels.skinny_linear`, and `kernels.skinny_add_norm_linear` with the residual
add and LayerNorm or RMSNorm before it; GeLU or SwiGLU after; the LM head), anything else the
layers' own forward and activation kernels. Inference only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .. import kernels
from ..layers import ColumnParallelLinear, LayerNorm, RMSNorm, RowParallelLinear

if TYPE_CHECKING:
    from ..gpt import GPT


def _one_row_kernel(tp_size: int, x: torch.Tensor) -> bool:
    """Whether a decoding step's product runs the skinny kernel: one row at TP=1 in half
    precision on CUDA (cuBLAS reads a one-row product's weight at a fraction of the bandwidth)."""
    return (
        tp_size == 1
        and x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and x.numel() == x.shape[-1]
    )


def decode_linear(
    layer: ColumnParallelLinear | RowParallelLinear,
    x: torch.Tensor,
    *,
    use_kernel: bool,
    gelu: bool = False,
    swiglu: bool = False,
    approximate: str = "tanh",
) -> torch.Tensor:
    """A decoding step's projection: `kernels.skinny_linear` for one row (`_one_row_kernel`),
    else the layer's forward; with gelu, bias + the GeLU follow (the layer skips its bias),
    approximate "tanh" or "none" as `kernels.bias_gelu`'s; with swiglu, `kernels.swiglu` over a
    gated layer's [gate; up] output (its bias, if any, added by the layer). Inference only."""
    if use_kernel and _one_row_kernel(layer.groups.tp_size, x):
        return kernels.skinny_linear(
            x,
            layer.weight,
            layer.bias,
            gelu=gelu,
            swiglu=swiglu,
            approximate=approximate,
            use_kernel=True,
        )
    y = layer(x)
    if swiglu:
        return kernels.swiglu(y, use_kernel=use_kernel)
    if not gelu:
        return y
    if layer.bias is None:  # --disable-bias-linear, as GeluMLP
        return F.gelu(y, approximate=approximate)
    return kernels.bias_gelu(y, layer.bias, approximate=approximate, use_kernel=use_kernel)


def decode_add_norm_linear(
    norm: LayerNorm | RMSNorm,
    x: torch.Tensor,
    residual: torch.Tensor,
    layer: ColumnParallelLinear,
    *,
    use_kernel: bool,
    gelu: bool = False,
    swiglu: bool = False,
    approximate: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(decode_linear(layer, norm(x + residual)), x + residual): for one row the add, the norm
    (LayerNorm or RMSNorm) and the product are one kernel (`kernels.skinny_add_norm_linear`),
    else `norm.add_norm` and `decode_linear`. Inference only."""
    if (
        use_kernel
        and _one_row_kernel(layer.groups.tp_size, x)
        and norm.sequence_parallel_group is None
        and residual.dtype == x.dtype
        and x.shape[-1] <= kernels.MAX_FUSED_NORM_WIDTH
    ):
        return kernels.skinny_add_norm_linear(
            x,
            residual,
            norm.weight,
            None if isinstance(norm, RMSNorm) else norm.bias,
            layer.weight,
            layer.bias,
            eps=norm.eps,
            normalization="rmsnorm" if isinstance(norm, RMSNorm) else "layernorm",
            gelu=gelu,
            swiglu=swiglu,
            approximate=approximate,
            use_kernel=True,
        )
    normed, summed = norm.add_norm(x, residual)
    out = decode_linear(
        layer, normed, use_kernel=use_kernel, gelu=gelu, swiglu=swiglu, approximate=approximate
    )
    return out, summed


def decode_lm_head(model: GPT, hidden: torch.Tensor) -> torch.Tensor:
    """`GPT.lm_head` for a decoding step: hidden (B, S, H) -> vocab-parallel logits (B, S, V/TP),
    one row through `kernels.skinny_linear` (`_one_row_kernel`) over `GPT.head_weight`, the
    step's largest weight (a Llama 3.2 1B's untied 128256 x 2048 rows, a quarter of its bytes)."""
    if model.config.use_fused_kernels and _one_row_kernel(model.groups.tp_size, hidden):
        return kernels.skinny_linear(hidden, model.head_weight, use_kernel=True)
    return model.lm_head(hidden)
