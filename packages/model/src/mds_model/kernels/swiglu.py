"""Fused SwiGLU activation, forward and backward: Megatron-DeepSpeed's `--swiglu`.

y (..., 2f) holds one tensor-parallel rank's `dense_h_to_4h` output, `[gate; up]` on the last dim,
and out (..., f) = silu(gate) * up, as upstream's megatron/model/transformer.py computes it
(`x = torch.chunk(x, 2, dim=-1); return F.silu(x[0]) * x[1]`) and transformers' LlamaMLP
(`act_fn(gate_proj(x)) * up_proj(x)`). Math in fp32; silu(gate) is rounded to y's dtype before the
product, as torch's two eager ops round it.
"""

import torch
import torch.nn.functional as F

from ._common import as_rows, check_kernel_device, num_warps_for


def swiglu_reference(y: torch.Tensor) -> torch.Tensor:
    """Pure-torch SwiGLU (the CPU path and the tests' oracle): upstream's two lines."""
    gate, up = torch.chunk(y, 2, dim=-1)
    return F.silu(gate) * up


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def silu_mul(gate, up, DTYPE: tl.constexpr):
        """silu(gate) * up of fp32 gate and up, silu(gate) rounded to DTYPE first as torch's two
        eager ops round it; the product stays fp32 for the caller to round. Shared with
        skinny_linear's epilogue."""
        # exp(-gate) overflows to inf for gate < ~-88: the sigmoid is then 0, the right limit.
        act = (gate / (1.0 + tl.exp(-gate))).to(DTYPE).to(tl.float32)
        return act * up

    @triton.jit
    def _swiglu_fwd(
        y_ptr,
        out_ptr,
        num_rows,
        half,
        stride_y,
        stride_out,
        BLOCK_M: tl.constexpr,
        BLOCK_F: tl.constexpr,
    ):
        rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        mask = (rows[:, None] < num_rows) & (cols < half)[None, :]
        gate_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gate_ptrs + half, mask=mask, other=0.0).to(tl.float32)
        out = silu_mul(gate, up, out_ptr.dtype.element_ty)
        tl.store(
            out_ptr + rows[:, None] * stride_out + cols[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=mask,
        )

    @triton.jit
    def _swiglu_bwd(
        dout_ptr,
        y_ptr,
        dy_ptr,
        num_rows,
        half,
        stride_dout,
        stride_y,
        stride_dy,
        BLOCK_M: tl.constexpr,
        BLOCK_F: tl.constexpr,
    ):
        # Recomputes the sigmoid from y (nothing but y is saved) and writes [dgate; dup].
        rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        mask = (rows[:, None] < num_rows) & (cols < half)[None, :]
        gate_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
        gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gate_ptrs + half, mask=mask, other=0.0).to(tl.float32)
        dout = tl.load(
            dout_ptr + rows[:, None] * stride_dout + cols[None, :], mask=mask, other=0.0
        ).to(tl.float32)
        sig = 1.0 / (1.0 + tl.exp(-gate))
        act = gate * sig
        # d silu / d gate = sig * (1 + gate * (1 - sig)); up's gradient uses silu(gate) as the
        # forward's product saw it, rounded to the storage dtype.
        dgate = dout * up * (sig + act * (1.0 - sig))
        dup = dout * act.to(dy_ptr.dtype.element_ty).to(tl.float32)
        dgate_ptrs = dy_ptr + rows[:, None] * stride_dy + cols[None, :]
        tl.store(dgate_ptrs, dgate.to(dy_ptr.dtype.element_ty), mask=mask)
        tl.store(dgate_ptrs + half, dup.to(dy_ptr.dtype.element_ty), mask=mask)


def _tile(num_rows: int, half: int) -> tuple[tuple[int, int], dict]:
    """The grid and tile: 2 rows x up to 2048 columns of each half per program, 16 elements of
    each operand per thread (at the Llama 3B shape on an H200, 360 and 606 us a forward and
    backward call against 371 and 622 us at 8 x 256); the grid's second axis (at most 65535
    programs) covers f up to ~134M."""
    block_m, block_f = 2, min(2048, triton.next_power_of_2(half))
    grid = (triton.cdiv(num_rows, block_m), triton.cdiv(half, block_f))
    warps = num_warps_for(block_m * block_f, elem_per_thread=16)
    return grid, dict(BLOCK_M=block_m, BLOCK_F=block_f, num_warps=warps)


class SwiGLUFunction(torch.autograd.Function):
    """Triton SwiGLU; saves y (not silu(gate)) and recomputes the sigmoid in the backward."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        y2d = as_rows(y)
        num_rows, width = y2d.shape
        half = width // 2
        out = torch.empty((num_rows, half), dtype=y.dtype, device=y.device)
        grid, tile = _tile(num_rows, half)
        _swiglu_fwd[grid](y2d, out, num_rows, half, y2d.stride(0), out.stride(0), **tile)
        ctx.save_for_backward(y2d)
        return out.view(*y.shape[:-1], half)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        (y2d,) = ctx.saved_tensors
        num_rows, width = y2d.shape
        half = width // 2
        dout2d = as_rows(dout)
        dy = torch.empty((num_rows, width), dtype=y2d.dtype, device=y2d.device)
        grid, tile = _tile(num_rows, half)
        _swiglu_bwd[grid](
            dout2d, y2d, dy, num_rows, half, dout2d.stride(0), y2d.stride(0), dy.stride(0), **tile
        )
        return dy.view(*dout.shape[:-1], width)


def swiglu(y: torch.Tensor, *, use_kernel: bool) -> torch.Tensor:
    """silu(gate) * up of y (..., 2f) = [gate; up] on the last dim, gate first (upstream's
    `--swiglu` layout on each TP rank); returns (..., f) in y's dtype, differentiable in y.

    There is no bias argument: Llama's linears have none; with a bias, add it to y first.
    """
    if y.dim() == 0 or y.shape[-1] % 2 != 0:
        raise ValueError(
            f"swiglu: the last dim of y holds [gate; up] and must be even, got shape "
            f"{tuple(y.shape)}"
        )
    if not use_kernel:
        return swiglu_reference(y)
    check_kernel_device(y, name="swiglu")
    return SwiGLUFunction.apply(y)
