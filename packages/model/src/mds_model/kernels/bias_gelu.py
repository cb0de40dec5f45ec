"""Fused bias add + GeLU, forward and backward: either of the two GeLUs Megatron computes.

approximate="tanh" (Megatron's fused `bias_gelu`, and `openai_gelu`):
y = 0.5*z*(1 + tanh(0.79788456*z*(1 + 0.044715*z*z))), z = x + bias, written here in the equivalent,
overflow-free form y = z * sigmoid(2u) with u the tanh argument.
approximate="none" (upstream's unfused `F.gelu(x + bias)` under --no-bias-gelu-fusion, and its
erf_gelu): y = z * Phi(z) = 0.5*z*(1 + erf(z / sqrt(2))). Names as torch's F.gelu. Math in fp32,
outputs in x's dtype.
"""

import torch
import torch.nn.functional as F

from ._common import as_rows, check_kernel_device
from ._reduce import sum_partials

_SQRT_2_OVER_PI = 0.7978845608028654
_CUBIC = 0.044715
APPROXIMATIONS = ("tanh", "none")  # F.gelu's `approximate`


def check_approximate(approximate: str) -> None:
    if approximate not in APPROXIMATIONS:
        raise ValueError(
            f"approximate must be one of {', '.join(APPROXIMATIONS)}; got {approximate!r}"
        )


def bias_gelu_reference(
    x: torch.Tensor, bias: torch.Tensor, *, approximate: str = "tanh"
) -> torch.Tensor:
    """Pure-torch bias+GeLU in fp32 (the CPU path and the tests' oracle); autograd gives the
    backward. The tanh form is Megatron's formula; the exact one upstream's `F.gelu`."""
    check_approximate(approximate)
    compute_dtype = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    z = x.to(compute_dtype) + bias.to(compute_dtype)
    if approximate == "none":
        return F.gelu(z).to(x.dtype)
    y = 0.5 * z * (1.0 + torch.tanh(_SQRT_2_OVER_PI * z * (1.0 + _CUBIC * z * z)))
    return y.to(x.dtype)


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def gelu(z, EXACT: tl.constexpr):
        """GeLU of fp32 z: exact (erf) or the tanh form. Shared with skinny_linear's epilogue."""
        if EXACT:
            return 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
        # sigmoid(2u) == 0.5*(1 + tanh(u)); exp overflow to inf gives the right limits (0 and 1).
        u = 0.7978845608028654 * z * (1.0 + 0.044715 * z * z)
        return z * (1.0 / (1.0 + tl.exp(-2.0 * u)))

    @triton.jit
    def _gelu_grad(z, EXACT: tl.constexpr):
        """d gelu / dz of fp32 z."""
        z2 = z * z
        if EXACT:
            # Phi(z) + z*phi(z), phi(z) = exp(-z^2/2)/sqrt(2 pi) = exp2(-z^2/(2 ln 2))/sqrt(2 pi);
            # exp2 underflows to 0 and erf saturates at +-1: the right limits, no inf.
            cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
            return cdf + z * 0.3989422804014327 * tl.exp2(z2 * -0.7213475204444817)
        # The derivative with its constants folded (the kernel was issue-bound at ~30 ops per
        # element): e = exp(-2u) = exp2(z*(K1 + K2*z^2)), s = sigmoid(2u),
        # dgelu = s + z*s*(1 - s)*2u', 2u' = 2c + 6ck*z^2, with c = sqrt(2/pi), k = 0.044715.
        e = tl.exp2(z * (-2.302208198144325 + -0.1029432395800235 * z2))
        s = 1.0 / (1.0 + e)  # exp2 overflow to inf gives s = 0, the right limit
        return z * (s - s * s) * (1.5957691216057308 + 0.21406444881780076 * z2) + s

    @triton.jit
    def _bias_gelu_fwd(
        x_ptr,
        b_ptr,
        y_ptr,
        num_rows,
        hidden,
        stride_x,
        stride_y,
        EXACT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        col_ok = cols < hidden
        mask = (rows[:, None] < num_rows) & col_ok[None, :]
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        z = x.to(tl.float32) + b[None, :]
        tl.store(
            y_ptr + rows[:, None] * stride_y + cols[None, :],
            gelu(z, EXACT).to(y_ptr.dtype.element_ty),
            mask=mask,
        )

    @triton.jit
    def _bias_gelu_bwd(
        dy_ptr,
        x_ptr,
        b_ptr,
        dx_ptr,
        dbias_partial_ptr,
        num_rows,
        hidden,
        stride_dy,
        stride_x,
        stride_dx,
        rows_per_program,
        EXACT: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        # Each program owns `rows_per_program` rows of one column block and writes one fp32 partial
        # row of dbias; sum_partials adds the (few) partial rows: the two-stage reduction.
        pid_m = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        col_ok = cols < hidden
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        # A 2-D accumulator: the cross-row (cross-warp) reduction happens once, after the loop.
        acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
        row_start = pid_m * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, num_rows)
        rows = row_start + tl.arange(0, BLOCK_M)
        mask = (rows < row_end)[:, None] & col_ok[None, :]
        offsets = rows.to(tl.int64)[:, None]
        x = tl.load(x_ptr + offsets * stride_x + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + offsets * stride_dy + cols[None, :], mask=mask, other=0.0)
        for _ in range(0, rows_per_program, BLOCK_M):
            # Software pipelining by hand: the next tile's loads are in flight while this one is
            # computed, so fewer resident programs keep the memory system busy.
            next_rows = rows + BLOCK_M
            next_mask = (next_rows < row_end)[:, None] & col_ok[None, :]
            next_offsets = next_rows.to(tl.int64)[:, None]
            x_next = tl.load(
                x_ptr + next_offsets * stride_x + cols[None, :], mask=next_mask, other=0.0
            )
            dy_next = tl.load(
                dy_ptr + next_offsets * stride_dy + cols[None, :], mask=next_mask, other=0.0
            )
            z = x.to(tl.float32) + b[None, :]
            dx = dy.to(tl.float32) * _gelu_grad(z, EXACT)
            tl.store(
                dx_ptr + offsets * stride_dx + cols[None, :],
                dx.to(dx_ptr.dtype.element_ty),
                mask=mask,
            )
            # Masked-out elements loaded x = dy = 0, so dx is exactly 0 there: no where() needed.
            acc += dx
            rows, offsets, mask, x, dy = next_rows, next_offsets, next_mask, x_next, dy_next
        tl.store(dbias_partial_ptr + pid_m * hidden + cols, tl.sum(acc, axis=0), mask=col_ok)


_FWD_BLOCK_M, _FWD_BLOCK_H = 16, 256
_BWD_BLOCK_M, _BWD_BLOCK_H = 8, 256
# Row tiles per backward program: enough that the prefetch and the final cross-warp sum pay off,
# few enough programs per column block that the dbias partials stay small (at most _MAX_PARTIALS).
_BWD_MIN_TILES_PER_PROGRAM, _MAX_PARTIALS = 8, 512


def _bias_gelu_forward(x2d: torch.Tensor, bias: torch.Tensor, *, exact: bool) -> torch.Tensor:
    num_rows, hidden = x2d.shape
    y = torch.empty((num_rows, hidden), dtype=x2d.dtype, device=x2d.device)
    grid = (triton.cdiv(num_rows, _FWD_BLOCK_M), triton.cdiv(hidden, _FWD_BLOCK_H))
    _bias_gelu_fwd[grid](
        x2d,
        bias,
        y,
        num_rows,
        hidden,
        x2d.stride(0),
        y.stride(0),
        EXACT=exact,
        BLOCK_M=_FWD_BLOCK_M,
        BLOCK_H=_FWD_BLOCK_H,
        num_warps=4,
    )
    return y


def _bias_gelu_backward(dy2d: torch.Tensor, x2d: torch.Tensor, bias: torch.Tensor, *, exact: bool):
    num_rows, hidden = x2d.shape
    dx = torch.empty((num_rows, hidden), dtype=x2d.dtype, device=x2d.device)
    num_tiles = triton.cdiv(num_rows, _BWD_BLOCK_M)
    tiles_per_program = max(_BWD_MIN_TILES_PER_PROGRAM, triton.cdiv(num_tiles, _MAX_PARTIALS))
    rows_per_program = tiles_per_program * _BWD_BLOCK_M
    num_row_programs = triton.cdiv(num_rows, rows_per_program)
    partial = torch.empty((num_row_programs, hidden), dtype=torch.float32, device=x2d.device)
    grid = (num_row_programs, triton.cdiv(hidden, _BWD_BLOCK_H))
    _bias_gelu_bwd[grid](
        dy2d,
        x2d,
        bias,
        dx,
        partial,
        num_rows,
        hidden,
        dy2d.stride(0),
        x2d.stride(0),
        dx.stride(0),
        rows_per_program,
        EXACT=exact,
        BLOCK_M=_BWD_BLOCK_M,
        BLOCK_H=_BWD_BLOCK_H,
        num_warps=4,
    )
    return dx, sum_partials(partial, bias.dtype)


class BiasGeluFunction(torch.autograd.Function):
    """Triton bias+GeLU; saves x and bias (not z or y) and recomputes z in the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: torch.Tensor, exact: bool) -> torch.Tensor:
        x2d = as_rows(x)
        bias = bias.contiguous()
        ctx.save_for_backward(x2d, bias)
        ctx.exact = exact
        return _bias_gelu_forward(x2d, bias, exact=exact).view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2d, bias = ctx.saved_tensors
        dx, dbias = _bias_gelu_backward(as_rows(dy), x2d, bias, exact=ctx.exact)
        return dx.view(dy.shape), dbias, None


def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor, *, approximate: str = "tanh", use_kernel: bool
) -> torch.Tensor:
    """y = gelu(x + bias), bias (H,) broadcast over x's last dim (H); differentiable in x and
    bias. approximate: "tanh" (Megatron's fused bias_gelu) or "none" (exact, erf), as F.gelu."""
    check_approximate(approximate)
    if bias.dim() != 1 or bias.shape[0] != x.shape[-1]:
        raise ValueError(
            f"bias_gelu: bias must have shape ({x.shape[-1]},), got {tuple(bias.shape)}"
        )
    if not use_kernel:
        return bias_gelu_reference(x, bias, approximate=approximate)
    check_kernel_device(x, bias, name="bias_gelu")
    return BiasGeluFunction.apply(x, bias, approximate == "none")
