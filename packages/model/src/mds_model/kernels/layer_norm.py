"""Fused residual add + LayerNorm, forward and backward (Megatron's FusedLayerNorm with the
residual add).

summed = x + residual; normed = (summed - mean) / sqrt(var + eps) * weight + bias, statistics in
fp32.
The backward reduces dweight/dbias in two stages (per-program fp32 partial rows, then a sum), as in
the
Triton tutorial's layer norm and Liger-Kernel.
"""

import torch
import torch.nn.functional as F

from ._common import as_rows, check_kernel_device, num_warps_for
from ._reduce import sum_partials


def add_layer_norm_reference(x, weight, bias, *, eps, residual=None):
    """Pure-torch add + LayerNorm (the CPU path and the tests' oracle): normed in x's dtype."""
    summed = x if residual is None else x + residual
    normed = F.layer_norm(summed.float(), (summed.shape[-1],), weight.float(), bias.float(), eps)
    return normed.to(x.dtype), summed


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def _add_layer_norm_fwd(
        x_ptr,
        res_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        sum_ptr,
        mean_ptr,
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
            # `summed`.
            s_low = (x.to(tl.float32) + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)
            tl.store(sum_ptr + rows[:, None] * stride_sum + cols[None, :], s_low, mask=mask)
            s = s_low.to(tl.float32)
        else:
            s = x.to(tl.float32)
        mean = tl.sum(s, axis=1) / hidden
        diff = tl.where(mask, s - mean[:, None], 0.0)
        var = tl.sum(diff * diff, axis=1) / hidden
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        y = diff * rstd[:, None] * w[None, :] + b[None, :]
        tl.store(
            y_ptr + rows[:, None] * stride_y + cols[None, :],
            y.to(y_ptr.dtype.element_ty),
            mask=mask,
        )
        tl.store(mean_ptr + rows, mean, mask=row_ok)
        tl.store(rstd_ptr + rows, rstd, mask=row_ok)

    @triton.jit
    def _add_layer_norm_bwd(
        dy_ptr,
        dsum_ptr,
        sum_ptr,
        w_ptr,
        mean_ptr,
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
        # dweight and one of dbias (partial_ptr is (programs, 2, hidden)); sum_partials adds them.
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_H)
        col_ok = cols < hidden
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        # dweight/dbias accumulate as tiles; rows are summed once at the end.
        dw_acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
        db_acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
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
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        for _ in range(0, rows_per_program, BLOCK_R):
            # Software pipelining by hand: the next tile's loads are in flight while this one is
            # computed, so a few resident programs per SM keep the memory system busy.
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
            mean_next = tl.load(mean_ptr + next_rows, mask=next_row_ok, other=0.0)
            rstd_next = tl.load(rstd_ptr + next_rows, mask=next_row_ok, other=0.0)

            dy32 = dy.to(tl.float32)
            # Masked elements: s = 0 gives xhat = -mean*rstd there, so mask it; dy = 0 keeps wdy,
            # c1, c2, dw and db exact without further masking.
            xhat = tl.where(mask, (s.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
            wdy = w[None, :] * dy32
            c1 = tl.sum(xhat * wdy, axis=1) / hidden
            c2 = tl.sum(wdy, axis=1) / hidden
            dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
            if HAS_DSUM:
                dx += dsum.to(tl.float32)
            tl.store(
                dx_ptr + offsets * stride_dx + cols[None, :],
                dx.to(dx_ptr.dtype.element_ty),
                mask=mask,
            )
            dw_acc += dy32 * xhat
            db_acc += dy32

            rows, row_ok, mask, offsets = next_rows, next_row_ok, next_mask, next_offsets
            s, dy, mean, rstd = s_next, dy_next, mean_next, rstd_next
            if HAS_DSUM:
                dsum = dsum_next
        out = partial_ptr + pid * 2 * hidden + cols
        tl.store(out, tl.sum(dw_acc, axis=0), mask=col_ok)
        tl.store(out + hidden, tl.sum(db_acc, axis=0), mask=col_ok)


_MAX_HIDDEN = 65536


def _tile(hidden: int) -> tuple[int, int, int]:
    """Forward (rows per tile, padded hidden, warps): ~4096 elements per tile, 16 per thread."""
    block_h = triton.next_power_of_2(hidden)
    block_r = max(1, min(16, 4096 // block_h))
    return block_r, block_h, num_warps_for(block_r * block_h, elem_per_thread=16)


def _bwd_tile(hidden: int) -> tuple[int, int, int]:
    """Backward (rows per tile, padded hidden, warps): 8 elements per thread keep the registers
    (two fp32 accumulators plus the prefetched tile) low enough for several programs per SM."""
    block_h = triton.next_power_of_2(hidden)
    block_r = max(1, min(16, 1024 // block_h))
    return block_r, block_h, num_warps_for(block_r * block_h, elem_per_thread=8)


# Backward programs per SM: at H=1024 the kernel takes 92 registers per thread (ptxas, sm_90a), so
# five 4-warp programs fit on an SM; four keep the partial-sum buffer small. Wider rows use more
# warps per program and fewer fit, which only makes the one wave a little uneven.
_BWD_PROGRAMS_PER_SM = 4


def _num_bwd_programs(num_tiles: int, device: torch.device) -> int:
    """One wave of persistent programs: each owns an equal run of rows, so none waits on a tail."""
    if device.type != "cuda":
        return max(1, min(num_tiles, 4))  # the CPU interpreter runs programs one after another
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(num_tiles, _BWD_PROGRAMS_PER_SM * sms))


class AddLayerNormFunction(torch.autograd.Function):
    """Triton add+LayerNorm. Returns (normed, summed); without a residual, summed is a view of x
    whose gradient the backward kernel adds into x's (HAS_DSUM), so a block that uses x again as
    its residual pays no separate add of the two gradients."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps):
        x2d = as_rows(x)
        num_rows, hidden = x2d.shape
        block_r, block_h, num_warps = _tile(hidden)
        y = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
        mean = torch.empty(num_rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(num_rows, dtype=torch.float32, device=x.device)
        if residual is not None:
            res2d = as_rows(residual)
            summed = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
        else:
            res2d, summed = x2d, x2d  # dummies the kernel never reads or writes
        weight_c, bias_c = weight.contiguous(), bias.contiguous()
        _add_layer_norm_fwd[(triton.cdiv(num_rows, block_r),)](
            x2d,
            res2d,
            weight_c,
            bias_c,
            y,
            summed,
            mean,
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
        ctx.save_for_backward(summed, weight_c, mean, rstd)
        ctx.has_residual = residual is not None
        ctx.set_materialize_grads(False)
        return y.view(x.shape), summed.view(x.shape)

    @staticmethod
    def backward(ctx, dnormed, dsummed=None):
        summed, weight, mean, rstd = ctx.saved_tensors
        num_rows, hidden = summed.shape
        if dnormed is None:
            dnormed = torch.zeros_like(summed)
        dy2d = as_rows(dnormed)
        dsum2d = as_rows(dsummed) if dsummed is not None else dy2d
        dx = torch.empty_like(summed)
        block_r, block_h, num_warps = _bwd_tile(hidden)
        num_tiles = triton.cdiv(num_rows, block_r)

        num_programs = _num_bwd_programs(num_tiles, summed.device)
        # One buffer of (programs, 2, hidden) partial rows: dweight's then dbias's.
        partial = torch.empty((num_programs, 2 * hidden), dtype=torch.float32, device=summed.device)
        _add_layer_norm_bwd[(num_programs,)](
            dy2d,
            dsum2d,
            summed,
            weight,
            mean,
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
        sums = sum_partials(partial, weight.dtype)
        dweight, dbias = sums[:hidden], sums[hidden:]
        return dx, (dx if ctx.has_residual else None), dweight, dbias, None


def add_layer_norm(x, weight, bias, *, eps: float, residual=None, use_kernel: bool):
    """(normed, summed): summed = x + residual (x's values when None: the kernel returns a view of
    x whose gradient its backward adds into x's), normed = LayerNorm(summed) * weight + bias.

    Statistics in fp32; normed and summed in x's dtype; differentiable in x, residual, weight, bias.
    """
    hidden = x.shape[-1]
    if weight.shape != (hidden,) or bias.shape != (hidden,):
        raise ValueError(
            f"add_layer_norm: weight and bias must have shape ({hidden},), "
            f"got {tuple(weight.shape)} and {tuple(bias.shape)}"
        )
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"add_layer_norm: residual must match x ({tuple(x.shape)}, {x.dtype}), "
            f"got {tuple(residual.shape)}, {residual.dtype}"
        )
    if not use_kernel:
        return add_layer_norm_reference(x, weight, bias, eps=eps, residual=residual)
    check_kernel_device(x, weight, name="add_layer_norm")
    if hidden > _MAX_HIDDEN:
        raise ValueError(
            f"add_layer_norm: the kernel keeps a row in registers; hidden {hidden} > "
            f"{_MAX_HIDDEN}, pass use_kernel=False"
        )
    return AddLayerNormFunction.apply(x, residual, weight, bias, eps)
