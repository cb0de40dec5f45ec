"""Linear layer for a few rows (one token per sequence while decoding): y = x W^T (+ b) [-> GeLU,
or SwiGLU over [gate; up]], optionally after a residual add and LayerNorm or RMSNorm.

cuBLAS runs a one-row product as a general matrix product at a fraction of the memory bandwidth
(on an H200, about 7 us for a 1024 x 3072 bf16 weight that takes 1.5 us to read); this kernel
streams the weight rows once per input row, each program owning BLOCK_N outputs over the whole
K, with bias and a GeLU (`bias_gelu`'s: tanh or exact) or SwiGLU (`swiglu`'s: each program owns
the gate rows j and the up rows f + j of a gated weight) in the epilogue. Forward only
(inference); the pure-torch reference beside it is the CPU path and the tests' oracle.
"""

import os

import torch
import torch.nn.functional as F

from ._common import check_kernel_device
from .bias_gelu import bias_gelu_reference, check_approximate
from .layer_norm import add_layer_norm_reference
from .rms_norm import add_rms_norm_reference
from .swiglu import swiglu_reference

NORMALIZATIONS = ("layernorm", "rmsnorm")


def skinny_linear_reference(
    x, weight, bias=None, *, gelu: bool = False, swiglu: bool = False, approximate="tanh"
):
    """F.linear, then (with gelu) `bias_gelu_reference`'s bias + GeLU in fp32, or (with swiglu)
    `swiglu_reference` over the output's [gate; up]; out in x's dtype."""
    if swiglu:
        return swiglu_reference(F.linear(x, weight, bias))
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
    from .swiglu import silu_mul

    @triton.jit
    def _epilogue(
        y,
        up,
        b_ptr,
        outs,
        out_ok,
        N,
        HAS_BIAS: tl.constexpr,
        GELU: tl.constexpr,
        EXACT_GELU: tl.constexpr,
        SWIGLU: tl.constexpr,
        DTYPE: tl.constexpr,
    ):
        """Bias and activation of fp32 products y (and up, SwiGLU's up rows N + outs)."""
        if HAS_BIAS:
            y += tl.load(b_ptr + outs, mask=out_ok, other=0.0).to(tl.float32)
        if GELU:
            y = _gelu(y, EXACT_GELU)
        if SWIGLU:
            if HAS_BIAS:
                up += tl.load(b_ptr + N + outs, mask=out_ok, other=0.0).to(tl.float32)
            # gate and up rounded as the product's output would be, then swiglu's rounding
            y = silu_mul(y.to(DTYPE).to(tl.float32), up.to(DTYPE).to(tl.float32), DTYPE)
        return y

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
        SWIGLU: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # N: the outputs (a gated weight's half: its rows N + outs are the up rows)
        row = tl.program_id(1).to(tl.int64)
        outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        out_ok = outs < N
        cols = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + outs.to(tl.int64)[:, None] * stride_w
        # A 2-D accumulator: the reduction over K happens once, after the loop.
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        if SWIGLU:  # the up rows' accumulator (a static branch: defined only when used)
            acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            k = start + cols
            k_ok = k < K
            x = tl.load(x_ptr + row * stride_x + k, mask=k_ok, other=0.0).to(tl.float32)
            w_ok = out_ok[:, None] & k_ok[None, :]
            w = tl.load(w_rows + k[None, :], mask=w_ok, other=0.0)
            acc += w.to(tl.float32) * x[None, :]
            if SWIGLU:
                w_up = tl.load(w_rows + N * stride_w + k[None, :], mask=w_ok, other=0.0)
                acc_up += w_up.to(tl.float32) * x[None, :]
        y = tl.sum(acc, axis=1)
        up = y  # SwiGLU's up rows N + outs, read only with SWIGLU
        if SWIGLU:
            up = tl.sum(acc_up, axis=1)
        y = _epilogue(
            y,
            up,
            b_ptr,
            outs,
            out_ok,
            N,
            HAS_BIAS,
            GELU,
            EXACT_GELU,
            SWIGLU,
            y_ptr.dtype.element_ty,
        )
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
        RMS_NORM: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        GELU: tl.constexpr,
        EXACT_GELU: tl.constexpr,
        SWIGLU: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # The whole row (BLOCK_K >= K) is summed and normed in every program, as
        # _add_layer_norm_fwd (or _add_rms_norm_fwd) does it (the sum rounded to its dtype
        # first, statistics in fp32, the normed row rounded to the activations' dtype); program 0
        # stores the sum.
        row = tl.program_id(1).to(tl.int64)
        cols = tl.arange(0, BLOCK_K)
        k_ok = cols < K
        x = tl.load(x_ptr + row * stride_x + cols, mask=k_ok, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * stride_res + cols, mask=k_ok, other=0.0).to(tl.float32)
        s_low = (x + r).to(sum_ptr.dtype.element_ty)
        if tl.program_id(0) == 0:
            tl.store(sum_ptr + row * stride_sum + cols, s_low, mask=k_ok)
        s = s_low.to(tl.float32)
        ln_w = tl.load(ln_w_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
        dtype = y_ptr.dtype.element_ty
        if RMS_NORM:
            # LlamaRMSNorm's order: the normalised row rounded, then weighted (no bias)
            rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / K + eps)
            normed = ((s * rstd).to(dtype).to(tl.float32) * ln_w).to(dtype).to(tl.float32)
        else:
            mean = tl.sum(s, axis=0) / K
            diff = tl.where(k_ok, s - mean, 0.0)
            rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=0) / K + eps)
            ln_b = tl.load(ln_b_ptr + cols, mask=k_ok, other=0.0).to(tl.float32)
            normed = (diff * rstd * ln_w + ln_b).to(dtype).to(tl.float32)
        outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        out_ok = outs < N
        w_rows = w_ptr + outs.to(tl.int64)[:, None] * stride_w
        w_ok = out_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + cols[None, :], mask=w_ok, other=0.0)
        y = tl.sum(w.to(tl.float32) * normed[None, :], axis=1)
        up = y  # SwiGLU's up rows N + outs, read only with SWIGLU
        if SWIGLU:
            w_up = tl.load(w_rows + N * stride_w + cols[None, :], mask=w_ok, other=0.0)
            up = tl.sum(w_up.to(tl.float32) * normed[None, :], axis=1)
        y = _epilogue(y, up, b_ptr, outs, out_ok, N, HAS_BIAS, GELU, EXACT_GELU, SWIGLU, dtype)
        tl.store(y_ptr + row * stride_y + outs, y.to(y_ptr.dtype.element_ty), mask=out_ok)


# Interpreted (CPU tests): few, large programs.
_INTERPRETER_CONFIG = (8, 256, 4)


def block_config(num_in: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps) for a weight of num_in columns. Many programs of two output
    rows each keep the most reads in flight: swept on an H200 with the weights cold in L2 (each
    launch of a graph reading another copy, as a decoding step does), two rows per program beat
    four to sixteen at every shape of the 345M GPT (1024 x 4096: 4.5 us against 8.0-26 us; 3072 x
    1024: 3.8 against 4.3-8.3) and match or beat cuBLAS (5.2-7.9 us). Llama 3.2 1B's widths
    (2048 and 8192) read best in steps of 1024 columns over four warps: 4.2, 10.3 and 47.5 us for
    its 2048 x 2048, 2048 x 8192 and 50304 x 2048 products against 4.7, 11.0 and 54.9 with the
    whole-row steps of eight warps (GPT-2's 1024 x 4096 keeps its 2048-column steps)."""
    if num_in in (2048, 8192):  # the widths measured; others keep the rule below
        return 2, 1024, 4
    block_k = min(triton.next_power_of_2(num_in), 2048)
    return 2, block_k, 1 if block_k <= 1024 else 8


def fused_norm_config(num_in: int, *, swiglu: bool) -> tuple[int, int]:
    """(BLOCK_N, num_warps) of `skinny_add_norm_linear` (every program holds the whole row):
    `block_config`'s for GPT-2's width (1024); past it two weight rows per program over two
    warps (SwiGLU's gate and up rows of one output): on the H200 sweep, Llama 3.2 1B's 16384 x
    2048 [gate; up] product took 19.0 us so against 20.8 with two outputs over eight warps."""
    if num_in <= 1024:
        block_n, _, warps = block_config(num_in)
        return block_n, warps
    return (1 if swiglu else 2), 2


def _blocks(num_in: int) -> tuple[int, int, int]:
    """`block_config`, or the interpreter's few large programs."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return _INTERPRETER_CONFIG if interpreted else block_config(num_in)


def _check_epilogue(weight, *, gelu: bool, swiglu: bool, approximate: str, name: str) -> int:
    """The outputs of a weight (N, K) under the epilogue: N, or N / 2 for SwiGLU's [gate; up]."""
    check_approximate(approximate)
    if gelu and swiglu:
        raise ValueError(f"{name}: gelu and swiglu are two activations; pass one")
    if swiglu and weight.shape[0] % 2:
        raise ValueError(
            f"{name}: swiglu needs a gated weight of [gate; up] rows (an even count), got "
            f"{tuple(weight.shape)}"
        )
    return weight.shape[0] // 2 if swiglu else weight.shape[0]


def skinny_linear(
    x,
    weight,
    bias=None,
    *,
    gelu: bool = False,
    swiglu: bool = False,
    approximate: str = "tanh",
    use_kernel: bool,
):
    """x (..., K) @ weight (N, K)^T [+ bias (N)] [-> GeLU] -> (..., N) in x's dtype; the GeLU's
    approximate is "tanh" or "none" (exact), as `bias_gelu`'s. With swiglu the weight is a gated
    MLP's [gate; up] (N = 2f) and the output silu(gate) * up (..., f), as `swiglu`'s.

    The kernel suits few rows (decoding); it reads the weight once per row. No autograd.
    """
    num_out = _check_epilogue(
        weight, gelu=gelu, swiglu=swiglu, approximate=approximate, name="skinny_linear"
    )
    if not use_kernel:
        return skinny_linear_reference(
            x, weight, bias, gelu=gelu, swiglu=swiglu, approximate=approximate
        )
    check_kernel_device(x, weight, name="skinny_linear")
    num_in = weight.shape[1]
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
        SWIGLU=swiglu,
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
    normalization: str = "layernorm",
    gelu: bool = False,
    swiglu: bool = False,
    approximate: str = "tanh",
    use_kernel: bool,
):
    """`skinny_linear(norm(x + residual))` and the sum: (y, summed), as `add_layer_norm` (or
    `add_rms_norm`, normalization "rmsnorm", norm_bias None) followed by `skinny_linear`, in one
    kernel (a decoding step's norm is a kernel of its own for a row of a few KB). x, residual
    (..., K) in one dtype, K <= MAX_FUSED_NORM_WIDTH."""
    num_out = _check_epilogue(
        weight, gelu=gelu, swiglu=swiglu, approximate=approximate, name="skinny_add_norm_linear"
    )
    rms_norm = normalization == "rmsnorm"
    if normalization not in NORMALIZATIONS or rms_norm != (norm_bias is None):
        raise ValueError(
            f"skinny_add_norm_linear: normalization must be one of {', '.join(NORMALIZATIONS)}, "
            f"with a norm bias for layernorm only; got {normalization!r} and norm_bias "
            f"{'None' if norm_bias is None else tuple(norm_bias.shape)}"
        )
    if not use_kernel:
        if rms_norm:
            normed, summed = add_rms_norm_reference(x, norm_weight, eps=eps, residual=residual)
        else:
            normed, summed = add_layer_norm_reference(
                x, norm_weight, norm_bias, eps=eps, residual=residual
            )
        reference = skinny_linear_reference(
            normed, weight, bias, gelu=gelu, swiglu=swiglu, approximate=approximate
        )
        return reference, summed
    check_kernel_device(x, residual, weight, name="skinny_add_norm_linear")
    num_in = weight.shape[1]
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
    if os.environ.get("TRITON_INTERPRET") == "1":
        block_n, _, warps = _INTERPRETER_CONFIG
    else:
        block_n, warps = fused_norm_config(num_in, swiglu=swiglu)
    block_k = triton.next_power_of_2(num_in)  # the whole row in every program
    _skinny_add_norm_linear_fwd[(triton.cdiv(num_out, block_n), rows.shape[0])](
        rows,
        res_rows,
        norm_weight,
        norm_weight if rms_norm else norm_bias,  # unread with RMS_NORM
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
        RMS_NORM=rms_norm,
        HAS_BIAS=bias is not None,
        GELU=gelu,
        EXACT_GELU=approximate == "none",
        SWIGLU=swiglu,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
    )
    return y.view(*x.shape[:-1], num_out), summed.view(x.shape)


def greedy_argmax_reference(logits, num_cols: int):
    """The first index of each row's largest logit among its first num_cols columns (B,) int64,
    as torch.argmax."""
    return logits[:, :num_cols].argmax(dim=-1)


if triton is not None:

    @triton.jit
    def _argmax_chunks_fwd(x_ptr, value_ptr, index_ptr, num_cols, stride_x, BLOCK: tl.constexpr):
        # (row, chunk) -> the chunk's largest value and its first index
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        num_chunks = tl.num_programs(1)
        cols = chunk * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < num_cols, other=float("-inf"))
        x = x.to(tl.float32)
        best = tl.max(x, axis=0)
        first = tl.min(tl.where(x == best, cols, num_cols), axis=0)
        tl.store(value_ptr + row * num_chunks + chunk, best)
        tl.store(index_ptr + row * num_chunks + chunk, first)

    @triton.jit
    def _argmax_rows_fwd(value_ptr, index_ptr, out_ptr, num_chunks, num_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        chunks = tl.arange(0, BLOCK)
        ok = chunks < num_chunks
        values = tl.load(value_ptr + row * num_chunks + chunks, mask=ok, other=float("-inf"))
        index = tl.load(index_ptr + row * num_chunks + chunks, mask=ok, other=num_cols)
        best = tl.max(values, axis=0)
        tl.store(out_ptr + row, tl.min(tl.where(values == best, index, num_cols), axis=0))


# Columns per program of greedy_argmax's first pass.
ARGMAX_BLOCK = 2048


def greedy_argmax(logits, *, num_cols: int, use_kernel: bool):
    """Greedy sampling's pick from logits (B, >= num_cols): each row's first index of its largest
    value among the first num_cols columns (B,) int64, as torch.argmax (NaN aside). The kernel
    spreads a row over programs of ARGMAX_BLOCK columns and reduces their maxima in a second,
    one-program pass: torch.argmax reduces a row of a 50K vocabulary in one block (17 us on an
    H200 against about 4 for the two passes)."""
    if not 1 <= num_cols <= logits.shape[-1] or logits.dim() != 2:
        raise ValueError(
            f"greedy_argmax: logits must be (B, >= num_cols {num_cols}), got {tuple(logits.shape)}"
        )
    if not use_kernel:
        return greedy_argmax_reference(logits, num_cols)
    check_kernel_device(logits, name="greedy_argmax")
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    batch = logits.shape[0]
    num_chunks = triton.cdiv(num_cols, ARGMAX_BLOCK)
    values = torch.empty((batch, num_chunks), dtype=torch.float32, device=logits.device)
    index = torch.empty((batch, num_chunks), dtype=torch.int64, device=logits.device)
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    _argmax_chunks_fwd[(batch, num_chunks)](
        logits, values, index, num_cols, logits.stride(0), BLOCK=ARGMAX_BLOCK, num_warps=4
    )
    _argmax_rows_fwd[(batch,)](
        values, index, out, num_chunks, num_cols,
        BLOCK=max(16, triton.next_power_of_2(num_chunks)), num_warps=1,
    )  # fmt: skip
    return out
