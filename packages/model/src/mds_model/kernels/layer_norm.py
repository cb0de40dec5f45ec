"""Fused residual add + LayerNorm, forward and backward (Megatron's FusedLayerNorm with the residual add).

summed = x + residual; normed = (summed - mean) / sqrt(var + eps) * weight + bias, statistics in fp32.
The backward reduces dweight/dbias in two stages (per-program fp32 partial rows, then a sum), as in the
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
    def _add_layer_norm_fwd(x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, sum_ptr, mean_ptr, rstd_ptr,
                            hidden, stride_x, stride_res, stride_y, stride_sum, eps,
                            HAS_RESIDUAL: tl.constexpr, BLOCK_H: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_H)
        mask = cols < hidden
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
            # Round the sum to the storage dtype first so the statistics describe the stored `summed`.
            s_low = (x.to(tl.float32) + r.to(tl.float32)).to(sum_ptr.dtype.element_ty)
            tl.store(sum_ptr + row * stride_sum + cols, s_low, mask=mask)
            s = s_low.to(tl.float32)
        else:
            s = x.to(tl.float32)
        mean = tl.sum(s, axis=0) / hidden
        diff = tl.where(mask, s - mean, 0.0)
        var = tl.sum(diff * diff, axis=0) / hidden
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = diff * rstd * w + b
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit
    def _add_layer_norm_bwd(dy_ptr, dsum_ptr, sum_ptr, w_ptr, mean_ptr, rstd_ptr, dx_ptr,
                            dw_partial_ptr, db_partial_ptr, num_rows, hidden,
                            stride_dy, stride_dsum, stride_sum, stride_dx,
                            HAS_DSUM: tl.constexpr, BLOCK_H: tl.constexpr):
        pid = tl.program_id(0)
        num_programs = tl.num_programs(0)
        cols = tl.arange(0, BLOCK_H)
        mask = cols < hidden
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        db_acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
        for row_i in range(pid, num_rows, num_programs):
            row = tl.cast(row_i, tl.int64)
            s = tl.load(sum_ptr + row * stride_sum + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            mean = tl.load(mean_ptr + row)
            rstd = tl.load(rstd_ptr + row)
            xhat = tl.where(mask, (s - mean) * rstd, 0.0)
            wdy = w * dy
            c1 = tl.sum(xhat * wdy, axis=0) / hidden
            c2 = tl.sum(wdy, axis=0) / hidden
            dx = (wdy - (xhat * c1 + c2)) * rstd
            if HAS_DSUM:
                dx += tl.load(dsum_ptr + row * stride_dsum + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw_acc += dy * xhat
            db_acc += dy
        tl.store(dw_partial_ptr + pid * hidden + cols, dw_acc, mask=mask)
        tl.store(db_partial_ptr + pid * hidden + cols, db_acc, mask=mask)


_MAX_HIDDEN = 65536


def _num_bwd_programs(num_rows: int, device: torch.device) -> int:
    if device.type == "cuda":
        # A few programs per SM keep the chip busy; more only grows the partial-sum buffers.
        return max(1, min(num_rows, 8 * torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(num_rows, 4))  # the CPU interpreter runs programs one after another


class AddLayerNormFunction(torch.autograd.Function):
    """Triton add+LayerNorm. Returns (normed, summed) with a residual, else normed alone."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps):
        x2d = as_rows(x)
        num_rows, hidden = x2d.shape
        block = triton.next_power_of_2(hidden)
        y = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
        mean = torch.empty(num_rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(num_rows, dtype=torch.float32, device=x.device)
        if residual is not None:
            res2d = as_rows(residual)
            summed = torch.empty((num_rows, hidden), dtype=x.dtype, device=x.device)
        else:
            res2d, summed = x2d, x2d  # dummies the kernel never reads or writes
        weight_c, bias_c = weight.contiguous(), bias.contiguous()
        _add_layer_norm_fwd[(num_rows,)](
            x2d, res2d, weight_c, bias_c, y, summed, mean, rstd, hidden,
            x2d.stride(0), res2d.stride(0), y.stride(0), summed.stride(0), eps,
            HAS_RESIDUAL=residual is not None, BLOCK_H=block, num_warps=num_warps_for(block))
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
        num_programs = _num_bwd_programs(num_rows, summed.device)
        dw_partial = torch.empty((num_programs, hidden), dtype=torch.float32, device=summed.device)
        db_partial = torch.empty_like(dw_partial)
        block = triton.next_power_of_2(hidden)
        _add_layer_norm_bwd[(num_programs,)](
            dy2d, dsum2d, summed, weight, mean, rstd, dx, dw_partial, db_partial, num_rows, hidden,
            dy2d.stride(0), dsum2d.stride(0), summed.stride(0), dx.stride(0),
            HAS_DSUM=dsummed is not None, BLOCK_H=block, num_warps=num_warps_for(block))
        dx = dx.view(dnormed.shape)
        dweight = dw_partial.sum(dim=0).to(weight.dtype)
        dbias = db_partial.sum(dim=0).to(weight.dtype)
        return dx, (dx if ctx.has_residual else None), dweight, dbias, None


def add_layer_norm(x, weight, bias, *, eps: float, residual=None, use_kernel: bool):
    """(normed, summed): summed = x + residual (x when None), normed = LayerNorm(summed) * weight + bias.

    Statistics in fp32; normed and summed in x's dtype; differentiable in x, residual, weight, bias.
    """
    hidden = x.shape[-1]
    if weight.shape != (hidden,) or bias.shape != (hidden,):
        raise ValueError(f"add_layer_norm: weight and bias must have shape ({hidden},), "
                         f"got {tuple(weight.shape)} and {tuple(bias.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"add_layer_norm: residual must match x ({tuple(x.shape)}, {x.dtype}), "
                         f"got {tuple(residual.shape)}, {residual.dtype}")
    if not use_kernel:
        return add_layer_norm_reference(x, weight, bias, eps=eps, residual=residual)
    check_kernel_device(x, weight, name="add_layer_norm")
    if hidden > _MAX_HIDDEN:
        raise ValueError(f"add_layer_norm: the kernel keeps a row in registers; hidden {hidden} > "
                         f"{_MAX_HIDDEN}, pass use_kernel=False")
    if residual is None:
        return AddLayerNormFunction.apply(x, None, weight, bias, eps), x
    return AddLayerNormFunction.apply(x, residual, weight, bias, eps)
