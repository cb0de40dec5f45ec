"""Gradient norm and clipping for fp32 runs, where DeepSpeed's `clip_fp32_gradients` falls short.

DeepSpeed clips fp32 (no ZeRO) gradients with `clip_grad_norm_`, which counts the pipeline's tied
embedding copy on the last stage a second time (its fp16/bf16 paths skip `ds_pipe_replicated`
parameters) and throws the norm away. This counts every parameter once, as Megatron's
`clip_grad_norm_fp32`, and keeps the norm for the log line. Half-precision runs keep DeepSpeed's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .deepspeed_engine import replace_fp32_clipping, replicated_by_pipeline


def counts_once(param: torch.nn.Parameter, *, tp_rank: int) -> bool:
    """Whether this rank's copy of a parameter enters the model's gradient norm."""
    if replicated_by_pipeline(param):  # the last stage's tied embedding copy
        return False
    return tp_rank == 0 or getattr(param, "tensor_model_parallel", False)


def norm_of(grads: list[torch.Tensor], model_parallel_group, partition_group=None) -> torch.Tensor:
    """The L2 norm of these gradients over the model-parallel group (and the data-parallel group
    whose ranks each hold a part of them: ZeRO-2's), accumulated in fp32."""
    if not grads:
        squares = torch.zeros((), dtype=torch.float32)
    else:  # one fused pass; bf16 gradients are summed (and their norms returned) in fp32
        norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
        squares = torch.stack(norms).pow(2).sum()
    for group in (partition_group, model_parallel_group):
        if group is not None:
            dist.all_reduce(squares, group=group)
    return squares.sqrt()


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """max_norm / (norm + 1e-6) clamped to 1, applied whatever it is, so the host never waits
    for the norm."""
    return torch.clamp(max_norm / (norm + 1e-6), max=1.0)


def clip_(grads: list[torch.Tensor], norm: torch.Tensor, max_norm: float) -> None:
    """Scales the gradients by clip_coefficient."""
    if grads:
        torch._foreach_mul_(grads, clip_coefficient(norm, max_norm).to(grads[0].device))


def install_fp32_clipping(engine, *, tp_rank: int, model_parallel_group) -> None:
    """Replaces the engine's fp32 clipping with one that counts every parameter once and records
    the norm. With MasterWeightAdamW the gradients are clipped on its fp32 copies, by its step."""

    def clip() -> torch.Tensor:
        prepare = getattr(engine.optimizer, "master_gradients", None)
        if prepare is not None:  # fp32 copies of bf16 gradients, each paired with its parameter
            pairs = prepare()
        else:
            pairs = [(p, p.grad.detach()) for p in engine.module.parameters() if p.grad is not None]
        counted = [grad for param, grad in pairs if counts_once(param, tp_rank=tp_rank)]
        partition_group = getattr(engine.optimizer, "gradient_partition_group", None)
        norm = norm_of(counted, model_parallel_group, partition_group)
        if prepare is not None:  # scaled inside its step where it can
            engine.optimizer.scale_gradients(clip_coefficient(norm, engine.gradient_clipping()))
        else:
            clip_([grad for _, grad in pairs], norm, engine.gradient_clipping())
        return norm

    replace_fp32_clipping(engine, clip)
