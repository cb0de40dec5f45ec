"""Scaled cast of a 2-D tensor to FP8, with its transpose and its amax in the same pass.

`torch._scaled_mm` takes its first operand row-major and its second column-major, so a linear's
backward needs the transposes of its FP8 input and FP8 output gradient (Transformer Engine's
cast-transpose). One kernel reads the 16-bit tensor once and writes both layouts, and folds the
tensor's largest magnitude into an fp32 amax slot (atomic max: micro-batches of a step accumulate).
Values are clamped to the format's range before the cast: torch's cast of an out-of-range value to
E4M3 gives NaN, Hopper's saturates; clamped, the two agree.
"""

from __future__ import annotations

import torch

from ..kernels._common import check_kernel_device


def cast_reference(
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor | None,
    dtype: torch.dtype,
    *,
    transpose: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pure-torch cast (the CPU path and the tests' oracle): (x * scale) clamped to dtype's range,
    cast; its contiguous transpose when asked; amax <- max(amax, max |x|) when given."""
    finite_max = torch.finfo(dtype).max
    x32 = x.float()
    if amax is not None:
        amax.copy_(torch.maximum(amax, x32.abs().amax()))
    out = (x32 * scale).clamp(-finite_max, finite_max).to(dtype)
    return out, (out.t().contiguous() if transpose else None)


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def _cast_kernel(
        x_ptr,
        scale_ptr,
        amax_ptr,
        out_ptr,
        out_t_ptr,
        num_rows,
        num_cols,
        FINITE_MAX: tl.constexpr,
        RECORD_AMAX: tl.constexpr,
        TRANSPOSE: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        cols = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
        mask = (rows < num_rows)[:, None] & (cols < num_cols)[None, :]
        x = tl.load(x_ptr + rows[:, None] * num_cols + cols[None, :], mask=mask, other=0.0)
        x = x.to(tl.float32)
        if RECORD_AMAX:
            tl.atomic_max(amax_ptr, tl.max(tl.max(tl.abs(x), axis=1), axis=0))
        scaled = tl.clamp(x * tl.load(scale_ptr), -FINITE_MAX, FINITE_MAX)
        out = scaled.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + rows[:, None] * num_cols + cols[None, :], out, mask=mask)
        if TRANSPOSE:
            tl.store(
                out_t_ptr + cols[:, None] * num_rows + rows[None, :],
                tl.trans(out),
                mask=tl.trans(mask),
            )


# 64 x 64 tiles: 8 KiB of bf16 in, both 4 KiB FP8 layouts out, transposed through registers.
_BLOCK = 64


def cast_to_fp8(
    x: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor | None,
    dtype: torch.dtype,
    *,
    transpose: bool,
    use_kernel: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x (R, C) contiguous -> (x8 (R, C), x8^T (C, R) contiguous or None), cast to `dtype` after
    multiplying by the fp32 one-element `scale`; `amax` (fp32, one element) gathers max |x|."""
    if not use_kernel:
        return cast_reference(x, scale, amax, dtype, transpose=transpose)
    check_kernel_device(x, name="cast_to_fp8")
    if not x.is_contiguous():
        raise ValueError("cast_to_fp8 takes a contiguous (rows, cols) tensor")
    num_rows, num_cols = x.shape
    out = torch.empty(num_rows, num_cols, dtype=dtype, device=x.device)
    out_t = torch.empty(num_cols, num_rows, dtype=dtype, device=x.device) if transpose else out
    grid = (triton.cdiv(num_rows, _BLOCK), triton.cdiv(num_cols, _BLOCK))
    _cast_kernel[grid](
        x,
        scale,
        amax if amax is not None else scale,  # not read without RECORD_AMAX
        out,
        out_t,
        num_rows,
        num_cols,
        FINITE_MAX=torch.finfo(dtype).max,
        RECORD_AMAX=amax is not None,
        TRANSPOSE=transpose,
        BLOCK_R=_BLOCK,
        BLOCK_C=_BLOCK,
        num_warps=4,
    )
    return out, (out_t if transpose else None)
