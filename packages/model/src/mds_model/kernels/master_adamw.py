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
    """One AdamW step of every tensor in pure torch, torch's AdamW formula written out (the
    tests' oracle): `steps` (float32 scalars) += 1; `masters`, `exp_avgs`, `exp_avg_sqs` (fp32)
    updated from `grads` (divided by `grad_scale` when given); `params` set to the new masters
    in their own dtype. MasterAdamWGroup.step does the same in one Triton launch."""
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
        """Entry `tensor` of row `row` of a (rows, num_tensors) address table, as a pointer like
        `element_pointer`."""
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
        pointers,  # int64 (5, num_tensors): param, master, exp_avg, exp_avg_sq, step addresses
        grad_pointers,  # int64 (num_tensors,): this step's gradients' addresses
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
        grad = _address(grad_pointers, 0, num_tensors, tensor, grad_like, ALIGNED)
        master = _address(pointers, 1, num_tensors, tensor, master_like, ALIGNED)
        exp_avg = _address(pointers, 2, num_tensors, tensor, master_like, ALIGNED)
        exp_avg_sq = _address(pointers, 3, num_tensors, tensor, master_like, ALIGNED)
        step = tl.load(_address(pointers, 4, num_tensors, tensor, master_like, False))
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


def _block_plan(sizes: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Which tensor, and which block of it, each program updates (int32 each, one per block)."""
    blocks = torch.tensor([-(-n // _BLOCK) for n in sizes], dtype=torch.int64)
    block_tensor = torch.repeat_interleave(torch.arange(len(sizes)), blocks)
    first_block = torch.cumsum(blocks, 0) - blocks
    block_index = torch.arange(int(blocks.sum())) - first_block[block_tensor]
    return block_tensor.to(device, torch.int32), block_index.to(device, torch.int32)


def _address_table(lists: list[list[torch.Tensor]], device: torch.device) -> torch.Tensor:
    table = torch.tensor([t.data_ptr() for tensors in lists for t in tensors], dtype=torch.int64)
    if device.type != "cuda":
        return table
    # From pinned memory the copy is queued without waiting for the device; the caching host
    # allocator keeps the block until the copy has run.
    return table.pin_memory().to(device, non_blocking=True)


class MasterAdamWGroup:
    """A parameter group's fixed tensors (weights, fp32 masters and moments, float32 step
    counts), checked, planned into blocks and tabulated once; `step(grads, ...)` then costs the
    host one address per gradient and one launch. Remake it when any of those tensors is
    replaced (a loaded optimizer state); `matches(params)` tells whether the weights moved."""

    def __init__(
        self,
        params: list[torch.Tensor],
        masters: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        steps: list[torch.Tensor],
    ) -> None:
        fixed = (params, masters, exp_avgs, exp_avg_sqs)
        if not params or len({len(tensors) for tensors in (*fixed, steps)}) != 1:
            raise ValueError("MasterAdamWGroup: every list needs one tensor per parameter")
        check_kernel_device(masters[0], name="MasterAdamWGroup")
        if any(t.dtype != params[0].dtype for t in params):
            raise ValueError("MasterAdamWGroup: params must share one dtype")
        if any(t.dtype != torch.float32 for tensors in fixed[1:] + (steps,) for t in tensors):
            raise ValueError("MasterAdamWGroup: masters, moments and steps must be float32")
        sizes = [m.numel() for m in masters]
        if any(
            not t.is_contiguous() or t.numel() != size
            for tensors in fixed
            for t, size in zip(tensors, sizes, strict=True)
        ):
            raise ValueError("MasterAdamWGroup: tensors must be contiguous and sized as masters")
        self.device = masters[0].device
        # Any weight and any master: the kernel takes its element types from their pointers.
        self._param_like, self._master_like = params[0], masters[0]
        # Fragments of one flat ZeRO partition share its step: each counter is advanced once.
        self._steps = list({id(step): step for step in steps}.values())
        self._param_addresses = tuple(p.data_ptr() for p in params)
        self._sizes = sizes
        self._numels = torch.tensor(sizes, dtype=torch.int64, device=self.device)
        self._block_tensor, self._block_index = _block_plan(sizes, self.device)
        self._table = _address_table([*fixed, steps], self.device)
        self._aligned = all(t.data_ptr() % 16 == 0 for tensors in fixed for t in tensors)

    def matches(self, params: list[torch.Tensor]) -> bool:
        return tuple(p.data_ptr() for p in params) == self._param_addresses

    def step(
        self,
        grads: list[torch.Tensor],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        eps: float,
        grad_scale: torch.Tensor | None = None,
    ) -> None:
        if len(grads) != len(self._sizes):
            raise ValueError("MasterAdamWGroup: every list needs one tensor per parameter")
        grads = [g if g.is_contiguous() else g.contiguous() for g in grads]  # only read
        if any(g.dtype != grads[0].dtype for g in grads) or any(
            g.numel() != size for g, size in zip(grads, self._sizes, strict=True)
        ):
            raise ValueError("MasterAdamWGroup: grads must share one dtype, sized as masters")
        torch._foreach_add_(self._steps, 1.0)
        aligned = self._aligned and all(g.data_ptr() % 16 == 0 for g in grads)
        beta1, beta2 = betas
        _master_adamw_kernel[(self._block_tensor.numel(),)](
            self._table,
            _address_table([grads], self.device),
            self._numels,
            self._block_tensor,
            self._block_index,
            len(self._sizes),
            self._param_like,
            grads[0],
            self._master_like,
            self._master_like if grad_scale is None else grad_scale,
            float(lr),
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
