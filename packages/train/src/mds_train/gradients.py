"""Gradient norm and clipping for fp32 runs, where DeepSpeed's `clip_fp32_gradients` falls short.

DeepSpeed clips fp32 (no ZeRO) gradients with `clip_grad_norm_`, which counts the pipeline's tied
embedding copy on the last stage a second time (its fp16/bf16 paths skip `ds_pipe_replicated`
parameters) and throws the norm away. This counts every parameter once, as Megatron's
`clip_grad_norm_fp32`, and keeps the norm for the log line. Half-precision runs keep DeepSpeed's.
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist


def global_grad_norm(
    parameters, *, tp_rank: int, model_parallel_group: dist.ProcessGroup | None
) -> torch.Tensor:
    """L2 norm over the model: pipeline copies and TP-replicated parameters counted once."""
    grads = [
        param.grad.detach()
        for param in parameters
        if param.grad is not None
        and not getattr(param, "ds_pipe_replicated", False)
        and (tp_rank == 0 or getattr(param, "tensor_model_parallel", False))
    ]
    if not grads:
        squares = torch.zeros((), dtype=torch.float32)
    else:  # one fused pass over all gradients, accumulated in fp32
        norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
        squares = torch.stack(norms).pow(2).sum()
    if model_parallel_group is not None:
        dist.all_reduce(squares, group=model_parallel_group)
    return squares.sqrt()


def install_fp32_clipping(engine, *, tp_rank: int, model_parallel_group) -> None:
    """Replaces the engine's fp32 clipping with `global_grad_norm`-based clipping (same rule:
    scale by max_norm / (norm + 1e-6) when that is below 1) that records the norm."""

    def clip_fp32_gradients(self) -> None:
        parameters = [p for p in self.module.parameters() if p.grad is not None]
        norm = global_grad_norm(
            parameters, tp_rank=tp_rank, model_parallel_group=model_parallel_group
        )
        # The scale is applied whatever it is (clamped to 1), so the host never waits for the norm.
        coefficient = torch.clamp(self.gradient_clipping() / (norm + 1e-6), max=1.0)
        grads = [param.grad.detach() for param in parameters]
        torch._foreach_mul_(grads, coefficient.to(grads[0].device))
        self._global_grad_norm = norm

    engine.clip_fp32_gradients = types.MethodType(clip_fp32_gradients, engine)
