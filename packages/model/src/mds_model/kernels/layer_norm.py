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
        dw_partial_ptr,
        db_partial_ptr,
        num_rows,
        hidden,
        stride_dy,
        stride_dsum,
        stride_sum,
        stride_dx,
        HAS_DSUM: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        pid = tl.program_id(0)
        num_programs = tl.num_programs(0)
        cols = tl.arange(0, BLOCK_H)
        col_ok = cols < hidden
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        # dweight/dbias accumulate as tiles; rows are summed once at the end, then across programs
        # by the launcher (the two-stage reduction).
        dw_acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
        db_acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=tl.float32)
        for block in range(pid, tl.cdiv(num_rows, BLOCK_R), num_programs):
            rows = (block * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
            row_ok = rows < num_rows
            mask = row_ok[:, None] & col_ok[None, :]
            s = tl.load(
                sum_ptr + rows[:, None] * stride_sum + cols[None, :], mask=mask, other=0.0
            ).to(tl.float32)
            dy = tl.load(
                dy_ptr + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0
            ).to(tl.float32)
            mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
            rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
            wdy = w[None, :] * dy
            c1 = tl.sum(xhat * wdy, axis=1) / hidden
            c2 = tl.sum(wdy, axis=1) / hidden
            dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
            if HAS_DSUM:
                dsum = tl.load(
                    dsum_ptr + rows[:, None] * stride_dsum + cols[None, :], mask=mask, other=0.0
                )
                dx += dsum.to(tl.float32)
            tl.store(
                dx_ptr + rows[:, None] * stride_dx + cols[None, :],
                dx.to(dx_ptr.dtype.element_ty),
                mask=mask,
            )
            dw_acc += dy * xhat
            db_acc += dy
        tl.store(dw_partial_ptr + pid * hidden + cols, tl.sum(dw_acc, axis=0), mask=col_ok)
        tl.store(db_partial_ptr + pid * hidden + cols, tl.sum(db_acc, axis=0), mask=col_ok)


_MAX_HIDDEN = 65536


def _tile(hidden: int) -> tuple[int, int, int]:
    """(rows per tile, padded hidden, warps): about 4096 elements per tile, 16 per thread."""
    block_h = triton.next_power_of_2(hidden)
    block_r = max(1, min(16, 4096 // block_h))
    return block_r, block_h, num_warps_for(block_r * block_h, elem_per_thread=16)


def _num_bwd_programs(num_row_blocks: int, device: torch.device) -> int:
    if device.type == "cuda":
        # A few programs per SM keep the chip busy; more only grows the partial-sum buffers.
        return max(
            1,
            min(num_row_blocks, 4 * torch.cuda.get_device_properties(device).multi_processor_count),
        )
    return max(1, min(num_row_blocks, 4))  # the CPU interpreter runs programs one after another


class AddLayerNormFunction(torch.autograd.Function):
    """Triton add+LayerNorm. Returns (normed, summed) with a residual, else normed alone."""

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
        if residual is None:
            return y.view(x.shape)
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
        block_r, block_h, num_warps = _tile(hidden)
        num_programs = _num_bwd_programs(triton.cdiv(num_rows, block_r), summed.device)
        dw_partial = torch.empty((num_programs, hidden), dtype=torch.float32, device=summed.device)
        db_partial = torch.empty_like(dw_partial)
        _add_layer_norm_bwd[(num_programs,)](
            dy2d,
            dsum2d,
            summed,
            weight,
            mean,
            rstd,
            dx,
            dw_partial,
            db_partial,
            num_rows,
            hidden,
            dy2d.stride(0),
            dsum2d.stride(0),
            summed.stride(0),
            dx.stride(0),
            HAS_DSUM=dsummed is not None,
            BLOCK_R=block_r,
            BLOCK_H=block_h,
            num_warps=num_warps,
        )
        dx = dx.view(dnormed.shape)
        dweight = dw_partial.sum(dim=0).to(weight.dtype)
        dbias = db_partial.sum(dim=0).to(weight.dtype)
        return dx, (dx if ctx.has_residual else None), dweight, dbias, None


def add_layer_norm(x, weight, bias, *, eps: float, residual=None, use_kernel: bool):
    """(normed, summed): summed = x + residual (x when None), normed = LayerNorm(summed) * weight +
    bias.

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
    if residual is None:
        return AddLayerNormFunction.apply(x, None, weight, bias, eps), x
    return AddLayerNormFunction.apply(x, residual, weight, bias, eps)
