"""bf16 weights with fp32 master weights and one fused AdamW step: the lean optimizer path.

DeepSpeed's bf16 optimizers wrap a client optimizer in per-parameter gradient copies and checks
(its BF16 optimizer reached 0.92x of a plain loop's tokens/s on the 345M GPT, its ZeRO-0 wrapper
0.48x; README: "The engines"). For ZeRO-0 without pipelining the engine runs in its fp32 mode over
bf16 parameters and this optimizer keeps the fp32 copies: in training, gradients are accumulated
in fp32 and averaged over data-parallel ranks during backward (grad_sync.py), or, with one replica
and one micro-batch per step, read as backward left them. On a GPU one Triton kernel per parameter
group (mds_model.kernels.master_adamw) reads those gradients, updates masters and moments, and
writes the bf16 weights; elsewhere torch's AdamW runs over fp32 copies of the gradients and the
weights are refreshed with one foreach copy. Its state dict holds the masters and torch's AdamW
state, so DeepSpeed's checkpoint of a ZeRO-0 optimizer restores them on either path.
"""

from __future__ import annotations

from typing import Any

import torch
from mds_model.kernels import triton_available
from mds_model.kernels.master_adamw import MasterAdamWGroup

from .grad_sync import GradientReduction


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW over fp32 copies of (bf16) parameters. `param_groups` are the model's: setting a
    group's `lr` (as the trainer's schedule does) applies to its masters at the next step."""

    def __init__(
        self,
        param_groups: list[dict[str, Any]],
        *,
        betas: tuple[float, float],
        eps: float,
        fused: bool | None = None,
        use_kernel: bool | None = None,
    ) -> None:
        super().__init__(param_groups, defaults={"lr": 0.0, "weight_decay": 0.0})
        self._gradients_cast = False
        self._gradient_divisor: torch.Tensor | None = None  # clipping's, for the fused step
        self._reduction: GradientReduction | None = None
        self.masters = [
            [param.detach().float().clone() for param in group["params"]]
            for group in self.param_groups
        ]
        on_gpu = all(p.is_cuda for group in self.masters for p in group)
        if fused is None:  # torch's fused AdamW on the GPU, its foreach one on the CPU
            fused = on_gpu
        # The Triton step (the kernel's interpreter on a CPU, for tests) or torch's AdamW.
        self.use_kernel = on_gpu and triton_available() if use_kernel is None else use_kernel
        # torch's AdamW without `reduce_in_backward` reads fp32 gradients: buffers filled by one
        # foreach copy per step. The kernel reads the model's own (4 bytes per parameter less).
        self._master_grads = (
            None
            if self.use_kernel
            else [[torch.empty_like(m) for m in group] for group in self.masters]
        )
        self._betas, self._eps = betas, eps
        # (group index, indices of the parameters stepped) -> the kernel's tables for them
        self._kernel_groups: dict[tuple[int, tuple[int, ...]], MasterAdamWGroup] = {}
        self.inner = torch.optim.AdamW(
            [
                {"params": masters, "weight_decay": group["weight_decay"], "lr": group["lr"]}
                for masters, group in zip(self.masters, self.param_groups, strict=True)
            ],
            betas=betas,
            eps=eps,
            fused=fused,
            foreach=None if fused else True,
        )

    def reduce_in_backward(
        self,
        model_parameters: list[torch.nn.Parameter],
        *,
        is_last_micro_batch,
        data_parallel_group,
        data_parallel_size: int,
        reduce_dtype: torch.dtype = torch.float32,
    ) -> None:
        """From now on every gradient is added into its master's fp32 gradient as backward makes
        it, and averaged over the data-parallel group there (the trainer turns DeepSpeed's own
        all-reduce off). `model_parameters` are the optimized parameters in the model's order;
        `is_last_micro_batch()` is the engine's accumulation boundary."""
        params = [param for group in self.param_groups for param in group["params"]]
        masters = [master for group in self.masters for master in group]
        # The model's own order (the groups split weights from biases), so that buckets fill
        # in the order backward produces the gradients.
        position = {id(param): index for index, param in enumerate(model_parameters)}
        order = sorted(range(len(params)), key=lambda i: position[id(params[i])])
        self._reduction = GradientReduction(
            [params[i] for i in order],
            [masters[i] for i in order],
            is_last_micro_batch=is_last_micro_batch,
            data_parallel_group=data_parallel_group,
            data_parallel_size=data_parallel_size,
            reduce_dtype=reduce_dtype,
        )
        self._master_grads = None

    @torch.no_grad()
    def master_gradients(self) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        """The gradients the step will read, each with its parameter: the reduction's fp32 sums
        (completed once per step), else the model's own gradients as the kernel reads them, else
        their fp32 copies (cast once per step). Clipping's norm accumulates in fp32 either way."""
        if self._reduction is not None:
            if not self._gradients_cast:
                self._reduction.finish()
                self._gradients_cast = True
        elif self.use_kernel:
            return [
                (param, param.grad)
                for group in self.param_groups
                for param in group["params"]
                if param.grad is not None
            ]
        elif not self._gradients_cast:
            sources, targets = [], []
            for group, masters, buffers in zip(
                self.param_groups, self.masters, self._master_grads, strict=True
            ):
                for param, master, buffer in zip(group["params"], masters, buffers, strict=True):
                    master.grad = None if param.grad is None else buffer
                    if param.grad is not None:
                        sources.append(param.grad)
                        targets.append(buffer)
            if targets:
                torch._foreach_copy_(targets, sources)
            self._gradients_cast = True
        return [
            (param, master.grad)
            for group, masters in zip(self.param_groups, self.masters, strict=True)
            for param, master in zip(group["params"], masters, strict=True)
            if master.grad is not None
        ]

    @torch.no_grad()
    def scale_gradients(self, coefficient: torch.Tensor) -> None:
        """Multiplies this step's gradients by `coefficient` (a scalar tensor: clipping's). The
        Triton step and torch's fused AdamW divide the gradients by a `grad_scale` as they read
        them, so there the product costs no pass of its own over the gradients (3.9 ms of a 1.3B
        step, measured); the foreach AdamW (CPU) has no such input, and the gradients are scaled
        now."""
        grads = [grad for _, grad in self.master_gradients()]
        if not grads:
            return
        coefficient = coefficient.to(grads[0].device, torch.float32)
        if self.use_kernel or self.inner.defaults["fused"]:
            self._gradient_divisor = coefficient.reciprocal()
        else:
            torch._foreach_mul_(grads, coefficient)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ARG002 - torch's signature
        if self.use_kernel:
            self._kernel_step()
            return None
        self.master_gradients()
        for group, inner_group in zip(self.param_groups, self.inner.param_groups, strict=True):
            inner_group["lr"] = group["lr"]
        if self._gradient_divisor is not None:
            self.inner.grad_scale = self._gradient_divisor  # read by torch's fused Adam step
        try:
            self.inner.step()
        finally:
            self.inner.__dict__.pop("grad_scale", None)
            self._gradient_divisor = None
        self.refresh_model_params()
        self._gradients_cast = False
        return None

    def _kernel_step(self) -> None:
        """One Triton launch per group over the parameters that have gradients; the state is
        torch's fused AdamW's (float32 step tensors on the device), made here on first use. The
        kernel's tables of the fixed tensors are kept, so a step costs the host one address per
        gradient."""
        gradients = {id(param): grad for param, grad in self.master_gradients()}
        for index, (group, masters) in enumerate(zip(self.param_groups, self.masters, strict=True)):
            params = group["params"]
            stepped = tuple(i for i, param in enumerate(params) if id(param) in gradients)
            if not stepped:
                continue
            chosen = [params[i] for i in stepped]
            kernel_group = self._kernel_groups.get((index, stepped))
            if kernel_group is None or not kernel_group.matches(chosen):
                states = [self._adamw_state(masters[i]) for i in stepped]
                kernel_group = MasterAdamWGroup(
                    [param.data for param in chosen],
                    [masters[i] for i in stepped],
                    [state["exp_avg"] for state in states],
                    [state["exp_avg_sq"] for state in states],
                    [state["step"] for state in states],
                )
                self._kernel_groups[(index, stepped)] = kernel_group
            kernel_group.step(
                [gradients[id(param)] for param in chosen],
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                betas=self._betas,
                eps=self._eps,
                grad_scale=self._gradient_divisor,
            )
        self._gradient_divisor = None
        self._gradients_cast = False

    def _adamw_state(self, master: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.inner.state[master]
        if not state:  # as torch's AdamW makes it for a fused step
            state["step"] = torch.zeros((), dtype=torch.float32, device=master.device)
            state["exp_avg"] = torch.zeros_like(master, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(master, memory_format=torch.preserve_format)
        elif state["step"].device != master.device or state["step"].dtype != torch.float32:
            state["step"] = state["step"].to(master.device, torch.float32)  # a foreach run's
        return state

    @torch.no_grad()
    def set_master_state(
        self, group_index: int, index: int, fp32: torch.Tensor, state: dict[str, torch.Tensor]
    ) -> None:
        """One parameter's fp32 master and AdamW state (step, exp_avg, exp_avg_sq) from outside
        a state dict: a reshaped checkpoint's. The model's weights follow at
        refresh_model_params."""
        master = self.masters[group_index][index]
        master.copy_(fp32.to(master.device))
        self.inner.state[master] = state
        self._kernel_groups.clear()  # they address the replaced tensors

    @torch.no_grad()
    def refresh_model_params(self) -> None:
        for group, masters in zip(self.param_groups, self.masters, strict=True):
            torch._foreach_copy_([p.data for p in group["params"]], masters)

    @torch.no_grad()
    def refresh_fp32_params(self) -> None:
        """Masters from the model's weights (after loading weights without optimizer state)."""
        for group, masters in zip(self.param_groups, self.masters, strict=True):
            torch._foreach_copy_(masters, [p.data.float() for p in group["params"]])

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        self._gradient_divisor = None
        if self._reduction is None:  # else the masters' gradients are views the reduction owns
            self.inner.zero_grad(set_to_none=True)
        self._gradients_cast = False

    def state_dict(self) -> dict[str, Any]:
        return {
            "inner": self.inner.state_dict(),
            "masters": [[m.clone() for m in group] for group in self.masters],
        }

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict["inner"])  # new moment and step tensors
        self._kernel_groups.clear()
        for masters, saved in zip(self.masters, state_dict["masters"], strict=True):
            saved_here = [s.to(m.device) for s, m in zip(saved, masters, strict=True)]
            torch._foreach_copy_(masters, saved_here)
        self.refresh_model_params()
