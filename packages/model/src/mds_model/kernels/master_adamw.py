"""AdamW over fp32 master weights that reads the model's gradients (bf16 or fp32) and writes its
(bf16) weights in the same pass, over a whole parameter group in one launch.

It replaces three passes of the mixed-precision step: the gradients' cast to fp32, torch's fused
AdamW over the masters, and the copy of the masters back into the model (40 bytes of memory traffic
per parameter with bf16 gradients, 28 here). The update is torch's AdamW: decoupled weight decay,
bias corrections from each tensor's own step count (a float32 scalar tensor, incremented here, as
torch's fused AdamW keeps it, so either can resume the other's state), and the gradient divided by
an optional `grad_scale` as torch's fused kernel reads it. Every list is addressed through a table
of pointers, so the tensors need not share a buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._common import check_kernel_device


@torch.no_grad()
def master_adamw_reference(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    masters: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    grad_scale: torch.Tensor | None = None,
) -> None:
    """Pure-torch step, torch's AdamW formula written out per tensor (the tests' oracle)."""
    beta1, beta2 = betas
    for param, grad, master, exp_avg, exp_avg_sq, step in zip(
        params, grads, masters, exp_avgs, exp_avg_sqs, steps, strict=True
    ):
        step += 1
        count = step.item()
        g = grad.float() if grad_scale is None else grad.float() / grad_scale
        master.mul_(1 - lr * weight_decay)
        exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2**count)).add_(eps)
        master.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**count))
        param.copy_(master)


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs run the reference
    triton = None

if triton is not None:

    @triton.jit
    def _address(pointers, row, num_tensors, tensor, element_pointer, ALIGNED: tl.constexpr):
        """Row `row` of the (6, num_tensors) pointer table, as a pointer like `element_pointer`."""
        address = tl.load(pointers + row * num_tensors + tensor)
        if ALIGNED:  # every address is a multiple of 16 bytes: vectorised loads and stores
            address = tl.multiple_of(address, 16)
        return address.to(element_pointer.dtype)

    @triton.jit
    def _adamw_block(
        param,
        grad,
        master,
        exp_avg,
        exp_avg_sq,
        offsets,
        mask,  # None for a block inside the tensor: unmasked, vectorised loads and stores
        grad_scale_ptr,
        lr_corrected,  # lr / (1 - beta1^step)
        bias_correction2_sqrt,
        decay_factor,
        beta1,
        beta2,
        eps,
        HAS_GRAD_SCALE: tl.constexpr,
    ):
        g = tl.load(grad + offsets, mask=mask).to(tl.float32)
        if HAS_GRAD_SCALE:
            g = g / tl.load(grad_scale_ptr)
        w = tl.load(master + offsets, mask=mask)
        m = tl.load(exp_avg + offsets, mask=mask)
        v = tl.load(exp_avg_sq + offsets, mask=mask)
        w = w * decay_factor
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        denom = tl.sqrt(v) / bias_correction2_sqrt + eps
        w = w - lr_corrected * (m / denom)
        tl.store(master + offsets, w, mask=mask)
        tl.store(exp_avg + offsets, m, mask=mask)
        tl.store(exp_avg_sq + offsets, v, mask=mask)
        tl.store(param + offsets, w.to(param.dtype.element_ty), mask=mask)

    @triton.jit
    def _master_adamw_kernel(
        pointers,  # int64 (6, num_tensors): param, grad, master, exp_avg, exp_avg_sq, step
        numels,  # int64 (num_tensors,)
        block_tensor,  # int32 (num_blocks,): which tensor each program updates
        block_index,  # int32 (num_blocks,): and which BLOCK of it
        num_tensors,
        param_like,  # any param and any grad: their pointer types give the element types
        grad_like,
        master_like,  # any fp32 tensor
        grad_scale_ptr,
        lr,
        decay_factor,  # 1 - lr * weight_decay
        beta1,
        beta2,
        log2_beta1,
        log2_beta2,
        eps,
        HAS_GRAD_SCALE: tl.constexpr,
        ALIGNED: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        program = tl.program_id(0)
        tensor = tl.load(block_tensor + program)
        start = tl.load(block_index + program).to(tl.int64) * BLOCK
        numel = tl.load(numels + tensor)
        offsets = start + tl.arange(0, BLOCK)
        param = _address(pointers, 0, num_tensors, tensor, param_like, ALIGNED)
        grad = _address(pointers, 1, num_tensors, tensor, grad_like, ALIGNED)
        master = _address(pointers, 2, num_tensors, tensor, master_like, ALIGNED)
        exp_avg = _address(pointers, 3, num_tensors, tensor, master_like, ALIGNED)
        exp_avg_sq = _address(pointers, 4, num_tensors, tensor, master_like, ALIGNED)
        step = tl.load(_address(pointers, 5, num_tensors, tensor, master_like, False))
        # torch's bias corrections: 1 - beta^step (exp2 of fp32; beta^step underflows to 0).
        lr_corrected = lr / (1.0 - tl.exp2(step * log2_beta1))
        bias_correction2_sqrt = tl.sqrt(1.0 - tl.exp2(step * log2_beta2))
        if start + BLOCK <= numel:
            _adamw_block(
                param, grad, master, exp_avg, exp_avg_sq, offsets, None, grad_scale_ptr,
                lr_corrected, bias_correction2_sqrt, decay_factor, beta1, beta2, eps,
                HAS_GRAD_SCALE,
            )  # fmt: skip
        else:  # the tensor's last block
            _adamw_block(
                param, grad, master, exp_avg, exp_avg_sq, offsets, offsets < numel,
                grad_scale_ptr, lr_corrected, bias_correction2_sqrt, decay_factor, beta1, beta2,
                eps, HAS_GRAD_SCALE,
            )  # fmt: skip


# Swept on an H100 over the 345M and 1.3B GPTs' tensors (1024/4, 2048/4, 2048/8, 4096/8): 1024
# elements and 4 warps moved 95% and 98% of a copy's bandwidth, the others 85-93%.
_BLOCK, _NUM_WARPS = 1024, 4


@dataclass(frozen=True)
class BlockPlan:
    """Which tensor and which block of it each program of the fused step updates: fixed by the
    tensors' sizes, so made once per parameter group and reused every step."""

    sizes: tuple[int, ...]  # on the host: checking a plan must not wait for the device
    numels: torch.Tensor  # int64 (num_tensors,)
    block_tensor: torch.Tensor  # int32 (num_blocks,)
    block_index: torch.Tensor  # int32 (num_blocks,)

    @classmethod
    def for_sizes(cls, numels: list[int], device: torch.device) -> BlockPlan:
        blocks = torch.tensor([-(-n // _BLOCK) for n in numels], dtype=torch.int64)
        block_tensor = torch.repeat_interleave(torch.arange(len(numels)), blocks)
        first_block = torch.cumsum(blocks, 0) - blocks
        block_index = torch.arange(int(blocks.sum())) - first_block[block_tensor]
        return cls(
            sizes=tuple(numels),
            numels=torch.tensor(numels, dtype=torch.int64, device=device),
            block_tensor=block_tensor.to(device, torch.int32),
            block_index=block_index.to(device, torch.int32),
        )

    def matches(self, tensors: list[torch.Tensor]) -> bool:
        return self.sizes == tuple(t.numel() for t in tensors)


def _pointer_table(lists: list[list[torch.Tensor]], device: torch.device) -> torch.Tensor:
    table = torch.tensor([t.data_ptr() for tensors in lists for t in tensors], dtype=torch.int64)
    if device.type != "cuda":
        return table
    # From pinned memory the copy is queued without waiting for the device; the caching host
    # allocator keeps the block until the copy has run.
    return table.pin_memory().to(device, non_blocking=True)


def master_adamw_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    masters: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    grad_scale: torch.Tensor | None = None,
    plan: BlockPlan | None = None,
    use_kernel: bool,
) -> None:
    """One AdamW step of every tensor: `steps` (float32 scalars) += 1; `masters`, `exp_avgs`,
    `exp_avg_sqs` (fp32) updated from `grads` (divided by `grad_scale` when given); `params` set
    to the new masters in their own dtype. All params share one dtype, all grads one. `plan`
    (BlockPlan.for_sizes of the masters) saves remaking it every step."""
    lists = (params, grads, masters, exp_avgs, exp_avg_sqs, steps)
    if len({len(tensors) for tensors in lists}) != 1:
        raise ValueError("master_adamw_step: every list needs one tensor per parameter")
    if not params:
        return
    if not use_kernel:
        master_adamw_reference(
            params, grads, masters, exp_avgs, exp_avg_sqs, steps,
            lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, grad_scale=grad_scale,
        )  # fmt: skip
        return
    check_kernel_device(masters[0], name="master_adamw_step")
    for tensors, dtype in ((params, params[0].dtype), (grads, grads[0].dtype)):
        if any(t.dtype != dtype for t in tensors):
            raise ValueError("master_adamw_step: params (and grads) must share one dtype")
    for tensors in (masters, exp_avgs, exp_avg_sqs, steps):
        if any(t.dtype != torch.float32 for t in tensors):
            raise ValueError("master_adamw_step: masters, moments and steps must be float32")
    grads = [g if g.is_contiguous() else g.contiguous() for g in grads]  # only read
    lists = (params, grads, masters, exp_avgs, exp_avg_sqs, steps)
    tensors_by_role = list(zip(*lists[:5], strict=True))
    if any(
        not t.is_contiguous() or t.numel() != group[2].numel()
        for group in tensors_by_role
        for t in group
    ):
        raise ValueError("master_adamw_step: tensors must be contiguous and sized as the masters")
    device = masters[0].device
    if plan is None or not plan.matches(masters):
        plan = BlockPlan.for_sizes([m.numel() for m in masters], device)
    torch._foreach_add_(steps, 1.0)
    pointers = _pointer_table(list(lists), device)
    aligned = all(t.data_ptr() % 16 == 0 for tensors in lists[:5] for t in tensors)
    beta1, beta2 = betas
    _master_adamw_kernel[(plan.block_tensor.numel(),)](
        pointers,
        plan.numels,
        plan.block_tensor,
        plan.block_index,
        len(masters),
        params[0],
        grads[0],
        masters[0],
        masters[0] if grad_scale is None else grad_scale,
        lr,
        1.0 - lr * weight_decay,
        beta1,
        beta2,
        math.log2(beta1) if beta1 > 0 else -math.inf,
        math.log2(beta2) if beta2 > 0 else -math.inf,
        eps,
        HAS_GRAD_SCALE=grad_scale is not None,
        ALIGNED=aligned,
        BLOCK=_BLOCK,
        num_warps=_NUM_WARPS,
    )
