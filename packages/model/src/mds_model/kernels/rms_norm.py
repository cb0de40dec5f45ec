"""Fused residual add + RMSNorm, forward and backward (Llama's RMSNorm with the residual add).

summed = x + residual; normed = weight * (s * rsqrt(mean(s^2) + eps)).to(x.dtype), s = summed in
fp32: Megatron-DeepSpeed's megatron/model/rmsnorm.py (`--normalization rmsnorm`) and transformers'
LlamaRMSNorm, which round the normalised row to the input dtype before multiplying by the weight.
No bias. The backward reduces dweight in two stages, as layer_norm.py does.
"""

import torch

from ._common import as_rows, check_kernel_device, num_warps_for
from ._reduce import sum_partials


def add_rms_norm_reference(x, weight, *, eps, residual=None):
    """Pure-torch add + RMSNorm (the CPU path and the tests' oracle): normed in x's dtype.

    The operations are LlamaRMSNorm's, in its order, so an fp32 or bf16 row gives its bits.
    """
    summed = x if residual is None else x + residual
    compute_dtype = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    hidden_states = summed.to(compute_dtype)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    normed = weight * hidden_states.to(x.dtype)
    # With an fp32 weight and bf16 x, LlamaRMSNorm returns fp32; here normed stays in x's dtype,
    # as add_layer_norm's does (the product is rounded once, as the kernel rounds it).
    return normed.to(x.dtype), summed


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def _add_rms_norm_fwd(
        x_ptr,
        res_ptr,
        w_ptr,
        y_ptr,
        sum_ptr,
        rstd_ptr,
        num_rows,
        hidden,
        stride_x,
        stride_res,
        stride_y,
        stride_sum,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        # A tile of BLOCK_R rows per program: short rows alone leave the SMs waiting on reductions.
        rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        cols = tl.arange(0, BLOCK_H)
        row_ok = rows < num_rows
        mask = row_ok[:, None] & (cols < hidden)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
            # Round the sum to the storage dtype first so the statistics describe the stored
            # `summed` (the next block's residual).
            s_low = (x.to(tl.float32) + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)
            tl.store(sum_ptr + rows[:, None] * stride_sum + cols[None, :], s_low, mask=mask)
            s = s_low.to(tl.float32)
        else:
            s = x.to(tl.float32)
        # Masked elements loaded 0, so they add nothing to the sum of squares.
        rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=1) / hidden + eps)
        w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        # LlamaRMSNorm's order: the normalised row is rounded to the storage dtype, then weighted
        # (a product of two 16-bit values is exact in fp32, so the one rounding below is torch's).
        normed = (s * rstd[:, None]).to(y_ptr.dtype.element_ty).to(tl.float32)
        tl.store(
            y_ptr + rows[:, None] * stride_y + cols[None, :],
            (normed * w[None, :]).to(y_ptr.dtype.element_ty),
            mask=mask,
        )
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)

    @triton.jit
    def _add_rms_norm_bwd(
        dy_ptr,
        dsum_ptr,
        sum_ptr,
        w_ptr,
        rstd_ptr,
        dx_ptr,
        partial_ptr,
        num_rows,
        hidden,
        stride_dy,
        stride_dsum,
        stride_sum,
        stride_dx,
        rows_per_program,
        HAS_DSUM: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        # Each program owns `rows_per_program` consecutive rows and writes one fp32 partial row of
        # dweight (partial_ptr is (programs, hidden)); sum_partials adds them.
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_H)
        col_ok = cols < hidden
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        dw_acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
        row_start = pid * rows_per_program
        row_end = tl.minimum(row_start + rows_per_program, num_rows)
        rows = row_start + tl.arange(0, BLOCK_R)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        offsets = rows.to(tl.int64)[:, None]
        s = tl.load(sum_ptr + offsets * stride_sum + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(dy_ptr + offsets * stride_dy + cols[None, :], mask=mask, other=0.0)
        if HAS_DSUM:
            dsum = tl.load(dsum_ptr + offsets * stride_dsum + cols[None, :], mask=mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        for _ in range(0, rows_per_program, BLOCK_R):
            # The next tile's loads are in flight while this one is computed (as layer_norm.py).
            next_rows = rows + BLOCK_R
            next_row_ok = next_rows < row_end
            next_mask = next_row_ok[:, None] & col_ok[None, :]
            next_offsets = next_rows.to(tl.int64)[:, None]
            s_next = tl.load(
                sum_ptr + next_offsets * stride_sum + cols[None, :], mask=next_mask, other=0.0
            )
            dy_next = tl.load(
                dy_ptr + next_offsets * stride_dy + cols[None, :], mask=next_mask, other=0.0
            )
            if HAS_DSUM:
                dsum_next = tl.load(
                    dsum_ptr + next_offsets * stride_dsum + cols[None, :],
                    mask=next_mask,
                    other=0.0,
                )
            rstd_next = tl.load(rstd_ptr + next_rows, mask=next_row_ok, other=0.0)

            dy32 = dy.to(tl.float32)
            # Masked elements loaded s = dy = 0, so normed, wdy and their products are 0 there.
            normed = s.to(tl.float32) * rstd[:, None]
            wdy = w[None, :] * dy32
            # d/ds of s * rstd(s): rstd * (wdy - normed * mean(wdy * normed)).
            c = tl.sum(wdy * normed, axis=1) / hidden
            dx = (wdy - normed * c[:, None]) * rstd[:, None]
            if HAS_DSUM:
                dx += dsum.to(tl.float32)
            tl.store(
                dx_ptr + offsets * stride_dx + cols[None, :],
                dx.to(dx_ptr.dtype.element_ty),
                mask=mask,
            )
            # The weight multiplies the rounded normalised row in the forward: so does its gradient.
            dw_acc += dy32 * normed.to(sum_ptr.dtype.element_ty).to(tl.float32)

            rows, row_ok, mask, offsets = next_rows, next_row_ok, next_mask, next_offsets
            s, dy, rstd = s_next, dy_next, rstd_next
            if HAS_DSUM:
                dsum = dsum_next
        tl.store(partial_ptr + pid * hidden + cols, tl.sum(dw_acc, axis=0), mask=col_ok)


_MAX_HIDDEN = 65536


def _tile(hidden: int) -> tuple[int, int, int]:
    """Forward (rows per tile, padded hidden, warps): ~4096 elements per tile, 16 per thread."""
    block_h = triton.next_power_of_2(hidden)
    block_r = max(1, min(16, 4096 // block_h))
    return block_r, block_h, num_warps_for(block_r * block_h, elem_per_thread=16)


def _bwd_tile(hidden: int) -> tuple[int, int, int]:
    """Backward (rows per tile, padded hidden, warps). Rows of 4096 or more padded elements:
    one row a tile, 32 elements per thread, so a row's sums cross few warps (hidden 3072 on an
    H200: 198 us a call against 247 us at 8 per thread). Shorter rows: 8 per thread, as
    layer_norm.py (one fp32 accumulator instead of two, so register pressure is no higher)."""
    block_h = triton.next_power_of_2(hidden)
    block_r = max(1, min(16, 1024 // block_h))
    per_thread = 32 if block_h >= 4096 else 8
    return block_r, block_h, num_warps_for(block_r * block_h, elem_per_thread=per_thread)


# Backward programs per SM, as layer_norm.py's: one persistent wave, a small partial-sum buffer.
_BWD_PROGRAMS_PER_SM = 4


def _num_bwd_programs(num_tiles: int, device: torch.device) -> int:
    """One wave of persistent programs: each owns an equal run of rows, so none waits on a tail."""
    if device.type != "cuda":
        return max(1, min(num_tiles, 4))  # the CPU interpreter runs programs one after another
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(num_tiles, _BWD_PROGRAMS_PER_SM * sms))


class AddRMSNormFunction(torch.autograd.Function):
    """Triton add+RMSNorm. Returns (normed, summed); without a residual, summed is a view of x
    whose gradient the backward kernel adds into x's (HAS_DSUM), as AddLayerNormFunction."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        x2d = as_rows(x)
        num_rows, hidden = x2d.shape
        block_r, block_h, num_warps = _tile(hidden)
        y = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
        rstd = torch.empty(num_rows, dtype=torch.float32, device=x.device)
        if residual is not None:
            res2d = as_rows(residual)
            summed = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
        else:
            res2d, summed = x2d, x2d  # dummies the kernel never reads or writes
        weight_c = weight.contiguous()
        _add_rms_norm_fwd[(triton.cdiv(num_rows, block_r),)](
            x2d,
            res2d,
            weight_c,
            y,
            summed,
            rstd,
            num_rows,
            hidden,
            x2d.stride(0),
            res2d.stride(0),
            y.stride(0),
            summed.stride(0),
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK_R=block_r,
            BLOCK_H=block_h,
            num_warps=num_warps,
        )
        ctx.save_for_backward(summed, weight_c, rstd)
        ctx.has_residual = residual is not None
        ctx.set_materialize_grads(False)
        return y.view(x.shape), summed.view(x.shape)

    @staticmethod
    def backward(ctx, dnormed, dsummed=None):
        summed, weight, rstd = ctx.saved_tensors
        num_rows, hidden = summed.shape
        if dnormed is None:
            dnormed = torch.zeros_like(summed)
        dy2d = as_rows(dnormed)
        dsum2d = as_rows(dsummed) if dsummed is not None else dy2d
        dx = torch.empty_like(summed)
        block_r, block_h, num_warps = _bwd_tile(hidden)
        num_tiles = triton.cdiv(num_rows, block_r)
        num_programs = _num_bwd_programs(num_tiles, summed.device)
        partial = torch.empty((num_programs, hidden), dtype=torch.float32, device=summed.device)
        _add_rms_norm_bwd[(num_programs,)](
            dy2d,
            dsum2d,
            summed,
            weight,
            rstd,
            dx,
            partial,
            num_rows,
            hidden,
            dy2d.stride(0),
            dsum2d.stride(0),
            summed.stride(0),
            dx.stride(0),
            triton.cdiv(num_tiles, num_programs) * block_r,
            HAS_DSUM=dsummed is not None,
            BLOCK_R=block_r,
            BLOCK_H=block_h,
            num_warps=num_warps,
        )
        dx = dx.view(dnormed.shape)
        dweight = sum_partials(partial, weight.dtype)
        return dx, (dx if ctx.has_residual else None), dweight, None


def add_rms_norm(x, weight, *, eps: float, residual=None, use_kernel: bool):
    """(normed, summed): summed = x + residual (x's values when None: the kernel returns a view of
    x whose gradient its backward adds into x's), normed = RMSNorm(summed) * weight.

    Statistics in fp32; normed and summed in x's dtype; differentiable in x, residual, weight.
    The calling convention is add_layer_norm's, without the bias.
    """
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(
            f"add_rms_norm: weight must have shape ({hidden},), got {tuple(weight.shape)}"
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"add_rms_norm: residual must match x ({tuple(x.shape)}, {x.dtype}), "
            f"got {tuple(residual.shape)}, {residual.dtype}"
        )
    if not use_kernel:
        return add_rms_norm_reference(x, weight, eps=eps, residual=residual)
    check_kernel_device(x, weight, name="add_rms_norm")
    if hidden > _MAX_HIDDEN:
        raise ValueError(
            f"add_rms_norm: the kernel keeps a row in registers; hidden {hidden} > "
            f"{_MAX_HIDDEN}, pass use_kernel=False"
        )
    return AddRMSNormFunction.apply(x, residual, weight, eps)
