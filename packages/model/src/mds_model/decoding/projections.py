"""A decoding step's projections: one row at TP=1 in half precision on CUDA runs the skinny
Triton kernels (`kernels.skinny_linear`, and `kernels.skinny_add_norm_linear` with the residual
add and LayerNorm before it), anything else the layers' own forward. Inference only.
"""

from __future__ import annotations

import torch

from .. import kernels
from ..layers import ColumnParallelLinear, LayerNorm, RowParallelLinear


def _one_row_kernel(layer: ColumnParallelLinear | RowParallelLinear, x: torch.Tensor) -> bool:
    """Whether a decoding step's product runs the skinny kernel: one row at TP=1 in half
    precision on CUDA (cuBLAS reads a one-row product's weight at a fraction of the bandwidth)."""
    return (
        layer.groups.tp_size == 1
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
    approximate: str = "tanh",
) -> torch.Tensor:
    """A decoding step's projection: `kernels.skinny_linear` for one row (`_one_row_kernel`),
    else the layer's forward; with gelu, bias + the GeLU follow (the layer skips its bias),
    approximate "tanh" or "none" as `kernels.bias_gelu`'s. Inference only."""
    if use_kernel and _one_row_kernel(layer, x):
        return kernels.skinny_linear(
            x, layer.weight, layer.bias, gelu=gelu, approximate=approximate, use_kernel=True
        )
    y = layer(x)
    if not gelu:
        return y
    return kernels.bias_gelu(y, layer.bias, approximate=approximate, use_kernel=use_kernel)


def decode_add_norm_linear(
    norm: LayerNorm,
    x: torch.Tensor,
    residual: torch.Tensor,
    layer: ColumnParallelLinear,
    *,
    use_kernel: bool,
    gelu: bool = False,
    approximate: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(decode_linear(layer, norm(x + residual)), x + residual): for one row the add, the norm
    and the product are one kernel (`kernels.skinny_add_norm_linear`), else `norm.add_norm` and
    `decode_linear`. Inference only."""
    if (
        use_kernel
        and _one_row_kernel(layer, x)
        and norm.sequence_parallel_group is None
        and residual.dtype == x.dtype
        and x.shape[-1] <= kernels.MAX_FUSED_NORM_WIDTH
    ):
        return kernels.skinny_add_norm_linear(
            x,
            residual,
            norm.weight,
            norm.bias,
            layer.weight,
            layer.bias,
            eps=norm.eps,
            gelu=gelu,
            approximate=approximate,
            use_kernel=True,
        )
    normed, summed = norm.add_norm(x, residual)
    out = decode_linear(layer, normed, use_kernel=use_kernel, gelu=gelu, approximate=approximate)
    return out, summed
