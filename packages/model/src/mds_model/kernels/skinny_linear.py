"""Linear layer for a few rows (one token per sequence while decoding): y = x W^T (+ b) [-> GeLU].

cuBLAS runs a one-row product as a general matrix product at a fraction of the memory bandwidth
(on an H200, about 7 us for a 1024 x 3072 bf16 weight that takes 1.5 us to read); this kernel
streams the weight rows once per input row, each program owning BLOCK_N outputs over the whole
K, with bias and a GeLU (`bias_gelu`'s: tanh or exact) in the epilogue. Forward only (inference);
the pure-torch reference beside it is the CPU path and the tests' oracle.
"""

import os

import torch
import torch.nn.functional as F

from ._common import check_kernel_device
from .bias_gelu import bias_gelu_reference, check_approximate
from .layer_norm import add_layer_norm_reference


def skinny_linear_reference(x, weight, bias=None, *, gelu: bool = False, approximate="tanh"):
    """F.linear, then (with gelu) `bias_gelu_reference`'s bias + GeLU in fp32; out in x's dtype."""
    if not gelu:
        return F.linear(x, weight, bias)
    y = F.linear(x, weight)
    if bias is None:
        bias = torch.zeros(y.shape[-1], dtype=y.dtype, device=y.device)
    return bias_gelu_reference(y, bias, approximate=approximate)


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:
    from .bias_gelu import gelu as _gelu

    @triton.jit
    def _skinny_linear_fwd(
        x_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        N,
        K,
        stride_x,
        stride_w,
        stride_y,
        HAS_BIAS: tl.constexpr,
        GELU: tl.constexpr,
        EXACT_GELU: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        row = tl.program_id(1).to(tl.int64)
        outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        out_ok = outs < N
        cols = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + outs.to(tl.int64)[:, None] * stride_w
        # A 2-D accumulator: the reduction over K happens once, after the loop.
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            k = start + cols
            k_ok = k < K
            x = tl.load(x_ptr + row * stride_x + k, mask=k_ok, other=0.0).to(tl.float32)
            w = tl.load(w_rows + k[None, :], mask=out_ok[:, None] & k_ok[None, :], other=0.0)
            acc += w.to(tl.float32) * x[None, :]
        y = tl.sum(acc, axis=1)
        if HAS_BIAS:
            y += tl.load(b_ptr + outs, mask=out_ok, other=0.0).to(tl.float32)
        if GELU:
            y = _gelu(y, EXACT_GELU)
        tl.store(y_ptr + row * stride_y + outs, y.to(y_ptr.dtype.element_ty), mask=out_ok)


if triton is not None:

    @triton.jit
    def _skinny_add_norm_linear_fwd(
        x_ptr,
        res_ptr,
        ln_w_ptr,
        ln_b_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        sum_ptr,
        N,
        K,
        stride_x,
        stride_res,
        stride_w,
        stride_y,
        stride_sum,
        eps,
        HAS_BIAS: tl.constexpr,
        GELU: tl.constexpr,
        EXACT_GELU: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # The whole row (BLOCK_K >= K) is summed and normed in every program, as
        # _add_layer_norm_fwd does it (the sum rounded to its dtype first, statistics in fp32,
        # the normed row rounded to the activations' dtype); program 0 stores the sum.
        row = tl.program_id(1).to(tl.int64)
        cols = tl.arange(0, BLOCK_K)
        k_ok = cols < K
        x = tl.load(x_ptr + row * stride_x + cols, mask=k_ok, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * stride_res + cols, mask=k_ok, other=0.0).to(tl.float32)
        s_low = (x + r).to(sum_ptr.dtype.element_ty)
        if tl.program_id(0) == 0:
            tl.store(sum_ptr + row * stride_sum + cols, s_low, mask=k_ok)
        s = s_low.to(tl.float32)
        mean = tl.sum(s, axis=0) / K
        diff = tl.where(k_ok, s - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / K + eps)
        ln_w = tl.load(ln_w_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
        ln_b = tl.load(ln_b_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
        normed = (diff * rstd * ln_w + ln_b).to(y_ptr.dtype.element_ty).to(tl.float32)
        outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        out_ok = outs < N
        w_rows = w_ptr + outs.to(tl.int64)[:, None] * stride_w
        w = tl.load(w_rows + cols[None, :], mask=out_ok[:, None] & k_ok[None, :], other=0.0)
        y = tl.sum(w.to(tl.float32) * normed[None, :], axis=1)
        if HAS_BIAS:
            y += tl.load(b_ptr + outs, mask=out_ok, other=0.0).to(tl.float32)
        if GELU:
            y = _gelu(y, EXACT_GELU)
        tl.store(y_ptr + row * stride_y + outs, y.to(y_ptr.dtype.element_ty), mask=out_ok)


# Interpreted (CPU tests): few, large programs.
_INTERPRETER_CONFIG = (8, 256, 4)


def block_config(num_in: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) for a weight of num_in columns. Many programs of two output
    rows each keep the most reads in flight: swept on an H200 with the weights cold in L2 (each
    launch of a graph reading another copy, as a decoding step does), two rows per program beat
    four to sixteen at every shape of the 345M GPT (1024 x 4096: 4.5 us against 8.0-26 us; 3072 x
    1024: 3.8 against 4.3-8.3) and match or beat cuBLAS (5.2-7.9 us)."""
    block_k = min(triton.next_power_of_2(num_in), 2048)
    return 2, block_k, 1 if block_k <= 1024 else 8


def _blocks(num_in: int) -> tuple[int, int, int]:
    """`block_config`, or the interpreter's few large programs."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return _INTERPRETER_CONFIG if interpreted else block_config(num_in)


def skinny_linear(
    x, weight, bias=None, *, gelu: bool = False, approximate: str = "tanh", use_kernel: bool
):
    """x (..., K) @ weight (N, K)^T [+ bias (N)] [-> GeLU] -> (..., N) in x's dtype; the GeLU's
    approximate is "tanh" or "none" (exact), as `bias_gelu`'s.

    The kernel suits few rows (decoding); it reads the weight once per row. No autograd.
    """
    check_approximate(approximate)
    if not use_kernel:
        return skinny_linear_reference(x, weight, bias, gelu=gelu, approximate=approximate)
    check_kernel_device(x, weight, name="skinny_linear")
    num_out, num_in = weight.shape
    if x.shape[-1] != num_in or weight.stride(1) != 1:
        raise ValueError(
            f"skinny_linear: x (..., {x.shape[-1]}) does not fit a row-major weight "
            f"{tuple(weight.shape)}"
        )
    rows = x.reshape(-1, num_in)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = torch.empty((rows.shape[0], num_out), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = _blocks(num_in)
    _skinny_linear_fwd[(triton.cdiv(num_out, block_n), rows.shape[0])](
        rows,
        weight,
        bias if bias is not None else weight,  # unread without HAS_BIAS
        y,
        num_out,
        num_in,
        rows.stride(0),
        weight.stride(0),
        y.stride(0),
        HAS_BIAS=bias is not None,
        GELU=gelu,
        EXACT_GELU=approximate == "none",
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
    )
    return y.view(*x.shape[:-1], num_out)


# Rows up to this width are normed inside the product's programs (each loads the whole row).
MAX_FUSED_NORM_WIDTH = 2048


def skinny_add_norm_linear(
    x,
    residual,
    norm_weight,
    norm_bias,
    weight,
    bias=None,
    *,
    eps: float,
    gelu: bool = False,
    approximate: str = "tanh",
    use_kernel: bool,
):
    """`skinny_linear(LayerNorm(x + residual))` and the sum: (y, summed), as `add_layer_norm`
    followed by `skinny_linear`, in one kernel (a decoding step's LayerNorm is a kernel of its own
    for a row of a few KB). x, residual (..., K) in one dtype, K <= MAX_FUSED_NORM_WIDTH."""
    check_approximate(approximate)
    if not use_kernel:
        normed, summed = add_layer_norm_reference(
            x, norm_weight, norm_bias, eps=eps, residual=residual
        )
        reference = skinny_linear_reference(
            normed, weight, bias, gelu=gelu, approximate=approximate
        )
        return reference, summed
    check_kernel_device(x, residual, weight, name="skinny_add_norm_linear")
    num_out, num_in = weight.shape
    if (
        x.shape != residual.shape
        or x.dtype != residual.dtype
        or x.shape[-1] != num_in
        or num_in > MAX_FUSED_NORM_WIDTH
        or weight.stride(1) != 1
    ):
        raise ValueError(
            f"skinny_add_norm_linear: x {tuple(x.shape)} and residual {tuple(residual.shape)} do "
            f"not fit a row-major weight {tuple(weight.shape)} (at most {MAX_FUSED_NORM_WIDTH} "
            "columns)"
        )
    rows, res_rows = (t.reshape(-1, num_in).contiguous() for t in (x, residual))
    y = torch.empty((rows.shape[0], num_out), dtype=x.dtype, device=x.device)
    summed = torch.empty_like(rows)
    block_n, _, warps = _blocks(num_in)
    block_k = triton.next_power_of_2(num_in)  # the whole row in every program
    _skinny_add_norm_linear_fwd[(triton.cdiv(num_out, block_n), rows.shape[0])](
        rows,
        res_rows,
        norm_weight,
        norm_bias,
        weight,
        bias if bias is not None else weight,  # unread without HAS_BIAS
        y,
        summed,
        num_out,
        num_in,
        rows.stride(0),
        res_rows.stride(0),
        weight.stride(0),
        y.stride(0),
        summed.stride(0),
        eps,
        HAS_BIAS=bias is not None,
        GELU=gelu,
        EXACT_GELU=approximate == "none",
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
    )
    return y.view(*x.shape[:-1], num_out), summed.view(x.shape)
