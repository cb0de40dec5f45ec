"""Fused scale + causal/boolean mask + softmax over attention scores, forward and backward.

Replaces Megatron's `FusedScaleMaskSoftmax` CUDA kernels, which asserted on sequence lengths (and
once
gave wrong results): rows of any length run, long rows through a two-pass online softmax. Masked
positions (key j > query i + Sk - Sq when causal, or mask True) get probability 0; rows with every
position masked give all zeros instead of NaN.
"""

import torch

from ._common import check_kernel_device, num_warps_for


def scaled_masked_softmax_reference(scores, *, scale, causal, mask=None):
    """Pure-torch version (the CPU path and the tests' oracle): softmax in fp32, output in scores'
    dtype."""
    seq_q, seq_k = scores.shape[-2:]
    s = scores.float() * scale
    masked = torch.zeros((seq_q, seq_k), dtype=torch.bool, device=scores.device)
    if causal:
        masked = torch.ones_like(masked).triu(diagonal=seq_k - seq_q + 1)
    if mask is not None:
        masked = masked | mask
    s = s.masked_fill(masked, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max).detach()
    e = torch.exp(s - row_max)
    # A fully masked row sums to 0: dividing by a tiny positive number keeps it 0 and its gradient
    # finite.
    probs = e / e.sum(dim=-1, keepdim=True).clamp_min(1e-30)
    return probs.to(scores.dtype)


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def _load_scaled_masked(
        x_row_ptr, m_row_ptr, stride_mk, cols, end, scale, HAS_MASK: tl.constexpr
    ):
        # `end` is the first key this row cannot see (seq_k, or the causal limit): nothing past
        # it is read, which halves the reads of a causal softmax.
        visible = cols < end
        x = tl.load(x_row_ptr + cols, mask=visible, other=0.0).to(tl.float32) * scale
        if HAS_MASK:
            visible = visible & (tl.load(m_row_ptr + cols * stride_mk, mask=visible, other=1) == 0)
        return tl.where(visible, x, float("-inf"))

    @triton.jit
    def _visible_end(row, seq_q, seq_k, CAUSAL: tl.constexpr):
        end = seq_k
        if CAUSAL:
            end = tl.minimum(seq_k, row % seq_q + seq_k - seq_q + 1)
        return end

    @triton.jit
    def _softmax_fwd(
        x_ptr,
        y_ptr,
        m_ptr,
        seq_q,
        seq_k,
        num_heads,
        scale,
        stride_mb,
        stride_mh,
        stride_mq,
        stride_mk,
        CAUSAL: tl.constexpr,
        HAS_MASK: tl.constexpr,
        SINGLE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        q = row % seq_q
        bh = row // seq_q
        m_row_ptr = (
            m_ptr + (bh // num_heads) * stride_mb + (bh % num_heads) * stride_mh + q * stride_mq
        )
        x_row_ptr = x_ptr + row * seq_k
        y_row_ptr = y_ptr + row * seq_k
        end = _visible_end(row, seq_q, seq_k, CAUSAL)
        if SINGLE:
            cols = tl.arange(0, BLOCK)
            x = _load_scaled_masked(x_row_ptr, m_row_ptr, stride_mk, cols, end, scale, HAS_MASK)
            row_max = tl.max(x, axis=0)
            row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
            e = tl.exp(x - row_max)
            total = tl.sum(e, axis=0)
            total = tl.where(total == 0.0, 1.0, total)
            tl.store(y_row_ptr + cols, (e / total).to(y_ptr.dtype.element_ty), mask=cols < seq_k)
        else:
            # Pass 1: online max and sum of exponentials; causal rows stop at their last visible
            # key. Per-lane running max and sum, combined once at the end (no reduction per block).
            lane_max = tl.full((BLOCK,), float("-inf"), tl.float32)
            lane_sum = tl.zeros((BLOCK,), dtype=tl.float32)
            for start in range(0, end, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = _load_scaled_masked(x_row_ptr, m_row_ptr, stride_mk, cols, end, scale, HAS_MASK)
                new_max = tl.maximum(lane_max, x)
                safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
                lane_sum = lane_sum * tl.exp(lane_max - safe_max) + tl.exp(x - safe_max)
                lane_max = new_max
            run_max = tl.max(lane_max, axis=0)
            run_max = tl.where(run_max == float("-inf"), 0.0, run_max)
            run_sum = tl.sum(lane_sum * tl.exp(lane_max - run_max), axis=0)
            run_sum = tl.where(run_sum == 0.0, 1.0, run_sum)
            for start in range(0, seq_k, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                x = _load_scaled_masked(x_row_ptr, m_row_ptr, stride_mk, cols, end, scale, HAS_MASK)
                y = tl.exp(x - run_max) / run_sum
                tl.store(y_row_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < seq_k)

    @triton.jit
    def _softmax_bwd(
        dy_ptr,
        y_ptr,
        dx_ptr,
        seq_q,
        seq_k,
        scale,
        CAUSAL: tl.constexpr,
        SINGLE: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # dx = scale * y * (dy - sum(dy * y)); masked positions have y == 0 and so get 0 (and
        # causally masked ones are not even read).
        row = tl.program_id(0).to(tl.int64)
        end = _visible_end(row, seq_q, seq_k, CAUSAL)
        if SINGLE:
            cols = tl.arange(0, BLOCK)
            ok = cols < end
            y = tl.load(y_ptr + row * seq_k + cols, mask=ok, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + row * seq_k + cols, mask=ok, other=0.0).to(tl.float32)
            dot = tl.sum(y * dy, axis=0)
            dx = scale * y * (dy - dot)
            tl.store(dx_ptr + row * seq_k + cols, dx.to(dx_ptr.dtype.element_ty), mask=cols < seq_k)
        else:
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            for start in range(0, end, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                ok = cols < end
                y = tl.load(y_ptr + row * seq_k + cols, mask=ok, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + row * seq_k + cols, mask=ok, other=0.0).to(tl.float32)
                acc += y * dy
            dot = tl.sum(acc, axis=0)
            for start in range(0, seq_k, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                ok = cols < end
                y = tl.load(y_ptr + row * seq_k + cols, mask=ok, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + row * seq_k + cols, mask=ok, other=0.0).to(tl.float32)
                dx = scale * y * (dy - dot)
                tl.store(
                    dx_ptr + row * seq_k + cols, dx.to(dx_ptr.dtype.element_ty), mask=cols < seq_k
                )


# Rows up to this length stay in registers (one read); longer rows stream in blocks of _LOOP_BLOCK.
_MAX_SINGLE_BLOCK = 8192
_LOOP_BLOCK = 4096


def _block_for(seq_k: int) -> tuple[bool, int]:
    block = triton.next_power_of_2(seq_k)
    if block <= _MAX_SINGLE_BLOCK:
        return True, block
    return False, _LOOP_BLOCK


class ScaledMaskedSoftmaxFunction(torch.autograd.Function):
    """Triton softmax; saves the probabilities (as Megatron does) for the backward."""

    @staticmethod
    def forward(ctx, scores, mask, scale, causal):
        scores_c = scores.contiguous()
        batch, num_heads, seq_q, seq_k = scores_c.shape
        probs = torch.empty_like(scores_c)
        if mask is not None:
            # Broadcast dimensions get stride 0; bool is read through a same-size uint8 view.
            mask_view = mask.expand(scores_c.shape).view(torch.uint8)
            strides = mask_view.stride()
        else:
            mask_view, strides = scores_c, (0, 0, 0, 0)
        single, block = _block_for(seq_k)
        num_rows = batch * num_heads * seq_q
        if num_rows > 0 and seq_k > 0:
            _softmax_fwd[(num_rows,)](
                scores_c,
                probs,
                mask_view,
                seq_q,
                seq_k,
                num_heads,
                scale,
                *strides,
                CAUSAL=causal,
                HAS_MASK=mask is not None,
                SINGLE=single,
                BLOCK=block,
                num_warps=num_warps_for(block),
            )
        ctx.save_for_backward(probs)
        ctx.scale, ctx.causal = scale, causal
        return probs

    @staticmethod
    def backward(ctx, dprobs):
        (probs,) = ctx.saved_tensors
        dprobs = dprobs.contiguous()
        seq_q, seq_k = probs.shape[-2:]
        dscores = torch.empty_like(probs)
        num_rows = probs.numel() // seq_k if seq_k else 0
        single, block = _block_for(seq_k) if seq_k else (True, 1)
        if num_rows > 0:
            _softmax_bwd[(num_rows,)](
                dprobs,
                probs,
                dscores,
                seq_q,
                seq_k,
                ctx.scale,
                CAUSAL=ctx.causal,
                SINGLE=single,
                BLOCK=block,
                num_warps=num_warps_for(block),
            )
        return dscores, None, None, None


def scaled_masked_softmax(scores, *, scale: float, causal: bool, mask=None, use_kernel: bool):
    """softmax(scale * scores) over the last dim with causal and/or boolean masking (True = masked
    out).

    scores: (B, heads, Sq, Sk); causal masks key j > query i + (Sk - Sq); mask: bool broadcastable
    to
    scores. Fully masked rows give zeros. Softmax in fp32, output in scores' dtype; differentiable.
    """
    if scores.dim() != 4:
        raise ValueError(
            f"scaled_masked_softmax: scores must be (B, heads, Sq, Sk), got {tuple(scores.shape)}"
        )
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ValueError(
                f"scaled_masked_softmax: mask must be bool (True = masked out), got {mask.dtype}"
            )
        try:
            if torch.broadcast_shapes(mask.shape, scores.shape) != scores.shape:
                raise RuntimeError
        except RuntimeError:
            raise ValueError(
                f"scaled_masked_softmax: mask {tuple(mask.shape)} does not broadcast to "
                f"scores {tuple(scores.shape)}"
            ) from None
        if mask.dim() < 4:
            mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if not use_kernel:
        return scaled_masked_softmax_reference(scores, scale=scale, causal=causal, mask=mask)
    check_kernel_device(scores, name="scaled_masked_softmax")
    return ScaledMaskedSoftmaxFunction.apply(scores, mask, float(scale), bool(causal))
