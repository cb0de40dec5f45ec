"""Vocab-parallel softmax cross-entropy (Megatron's `vocab_parallel_cross_entropy`), forward and
backward.

Each rank holds logits for vocab ids [vocab_start, vocab_start + V_local); the per-row max, sum of
exponentials and target logit are combined across the tensor-parallel group. The Triton path streams
each row once in the forward (online softmax) and once in the backward, never making an fp32 copy of
the (N, V_local) logits; the gradient is written straight in the logits' dtype.
"""

import torch
import torch.distributed as dist

from ._common import check_kernel_device


def _combine_over_group(local_max, local_sum_exp, target_logit, group):
    """Per-row log-sum-exp and target logit over the whole vocab from each rank's shard
    statistics."""
    if group is None or dist.get_world_size(group) == 1:
        return local_max + torch.log(local_sum_exp), target_logit
    global_max = local_max.clone()
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    # One SUM all-reduce carries both the rescaled sums and the target logit (held by one rank
    # only).
    stacked = torch.stack([local_sum_exp * torch.exp(local_max - global_max), target_logit])
    dist.all_reduce(stacked, op=dist.ReduceOp.SUM, group=group)
    return global_max + torch.log(stacked[0]), stacked[1]


def _local_target(target, vocab_start_index, vocab_size_local):
    local = target - vocab_start_index
    in_shard = (local >= 0) & (local < vocab_size_local)
    return local.clamp(0, vocab_size_local - 1), in_shard


class _ReferenceCrossEntropy(torch.autograd.Function):
    """Pure-torch vocab-parallel cross-entropy in fp32 (the CPU path and the tests' oracle)."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start_index):
        logits32 = logits.float()
        local_target, in_shard = _local_target(target, vocab_start_index, logits.shape[-1])
        local_max = logits32.max(dim=-1).values
        local_sum_exp = torch.exp(logits32 - local_max[:, None]).sum(dim=-1)
        target_logit = logits32.gather(1, local_target[:, None]).squeeze(1) * in_shard
        lse, target_logit = _combine_over_group(local_max, local_sum_exp, target_logit, group)
        ctx.save_for_backward(logits, local_target, in_shard, lse)
        return lse - target_logit

    @staticmethod
    def backward(ctx, dloss):
        logits, local_target, in_shard, lse = ctx.saved_tensors
        grad = torch.exp(logits.float() - lse[:, None])
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local_target] -= in_shard.float()
        return (grad * dloss[:, None]).to(logits.dtype), None, None, None


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def _cross_entropy_fwd(
        logits_ptr,
        target_ptr,
        max_ptr,
        sum_exp_ptr,
        target_logit_ptr,
        vocab_local,
        vocab_start,
        stride_row,
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * stride_row
        # Online softmax with a per-block (scalar) running max: one exp per element. A per-lane max
        # needs two, and at bf16 rates the exp unit, not memory, then bounds the kernel.
        row_max = float("-inf")
        row_sum = 0.0
        for start in range(0, vocab_local, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(row_ptr + cols, mask=cols < vocab_local, other=float("-inf")).to(tl.float32)
            # Every block holds at least one real logit, so new_max is finite.
            new_max = tl.maximum(row_max, tl.max(x, axis=0))
            row_sum = row_sum * tl.exp(row_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
            row_max = new_max
        local = tl.load(target_ptr + row) - vocab_start
        in_shard = (local >= 0) & (local < vocab_local)
        target_logit = tl.load(row_ptr + tl.where(in_shard, local, 0), mask=in_shard, other=0.0)
        tl.store(max_ptr + row, row_max)
        tl.store(sum_exp_ptr + row, row_sum)
        tl.store(target_logit_ptr + row, target_logit.to(tl.float32))

    @triton.jit
    def _cross_entropy_bwd(
        logits_ptr,
        target_ptr,
        lse_ptr,
        dloss_ptr,
        grad_ptr,
        vocab_local,
        vocab_start,
        stride_row,
        stride_grad,
        BLOCK_V: tl.constexpr,
    ):
        # grad = (softmax(x) - onehot(target)) * dloss, softmax recomputed from x and the saved lse.
        row = tl.program_id(0).to(tl.int64)
        lse = tl.load(lse_ptr + row)
        dloss = tl.load(dloss_ptr + row).to(tl.float32)
        local = tl.load(target_ptr + row) - vocab_start
        for start in range(0, vocab_local, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            ok = cols < vocab_local
            x = tl.load(logits_ptr + row * stride_row + cols, mask=ok, other=0.0).to(tl.float32)
            p = tl.exp(x - lse)
            p = tl.where(cols == local, p - 1.0, p)
            tl.store(
                grad_ptr + row * stride_grad + cols,
                (p * dloss).to(grad_ptr.dtype.element_ty),
                mask=ok,
            )


_BLOCK_V = 4096


def _block_v(vocab_local: int) -> int:
    return min(_BLOCK_V, triton.next_power_of_2(vocab_local))


class CrossEntropyFunction(torch.autograd.Function):
    """Triton vocab-parallel cross-entropy; saves the logits, targets and per-row log-sum-exp."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start_index):
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        target = target.contiguous()
        num_rows, vocab_local = logits.shape
        local_max = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
        local_sum_exp = torch.empty_like(local_max)
        target_logit = torch.empty_like(local_max)
        block = _block_v(vocab_local)
        if num_rows > 0:
            _cross_entropy_fwd[(num_rows,)](
                logits,
                target,
                local_max,
                local_sum_exp,
                target_logit,
                vocab_local,
                vocab_start_index,
                logits.stride(0),
                BLOCK_V=block,
                num_warps=8,
            )
        lse, target_logit = _combine_over_group(local_max, local_sum_exp, target_logit, group)
        ctx.save_for_backward(logits, target, lse)
        ctx.vocab_start_index = vocab_start_index
        return lse - target_logit

    @staticmethod
    def backward(ctx, dloss):
        logits, target, lse = ctx.saved_tensors
        num_rows, vocab_local = logits.shape
        grad = torch.empty_like(logits)
        if num_rows > 0:
            _cross_entropy_bwd[(num_rows,)](
                logits,
                target,
                lse,
                dloss.contiguous(),
                grad,
                vocab_local,
                ctx.vocab_start_index,
                logits.stride(0),
                grad.stride(0),
                BLOCK_V=_block_v(vocab_local),
                num_warps=8,
            )
        return grad, None, None, None


def vocab_parallel_cross_entropy(
    logits, target, *, group=None, vocab_start_index: int = 0, use_kernel: bool
):
    """Per-token fp32 loss (N,) of logits (N, V_local), this rank's vocab shard, against global ids
    (N,).

    Max, sum-exp and the target logit are all-reduced over `group` (None = no tensor parallelism);
    the gradient w.r.t. logits comes back in the logits' dtype. Targets must be valid vocab ids.
    """
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(
            f"vocab_parallel_cross_entropy: expected logits (N, V_local) and target (N,), "
            f"got {tuple(logits.shape)} and {tuple(target.shape)}"
        )
    if target.dtype != torch.int64:
        raise ValueError(f"vocab_parallel_cross_entropy: target must be int64, got {target.dtype}")
    if not use_kernel:
        return _ReferenceCrossEntropy.apply(logits, target, group, int(vocab_start_index))
    check_kernel_device(logits, target, name="vocab_parallel_cross_entropy")
    return CrossEntropyFunction.apply(logits, target, group, int(vocab_start_index))
