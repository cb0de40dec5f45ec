"""y = x W^T + b with FP8 operands: `torch._scaled_mm` for the output, the input gradient and the
weight gradient (or the weight gradient in 16 bits without fp8_wgrad), as Transformer Engine's
`Linear` under `fp8_autocast` with delayed scaling.

The first step of a run calibrates: the linears compute in 16 bits and only record their amaxes,
so the first FP8 step casts with scales from real amaxes. Transformer Engine casts its first step
with scale 1, which flushes most E5M2 gradients (around 1e-6, below E5M2's 1.5e-5) to zero and
moves the loss for a few steps (measured: +5% at iteration 6 at 1.3B).

Each linear reads its scales and records its amaxes through an `Fp8Slot`: views of one row of the
model's scaling state (`training.Fp8Training`), so the step's update is a few kernels for all
linears together and nothing here waits on the host. The FP8 weight (and its transpose) is cast once
per optimizer step and kept until `Fp8Training.update` drops it: micro-batches, the backward and an
activation-checkpointing recompute all use the same cast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cast import cast_to_fp8
from .recipe import GRAD_OUTPUT, INPUT, WEIGHT, Fp8Recipe


@dataclass
class Fp8Slot:
    """One linear's scaling views: scale, scale_inv (the dequantizing factor `_scaled_mm` takes)
    and amax, each a one-element fp32 view per role; and its cached FP8 weight."""

    recipe: Fp8Recipe
    use_kernel: bool
    scale: tuple[torch.Tensor, ...]
    scale_inv: tuple[torch.Tensor, ...]
    amax: tuple[torch.Tensor, ...]
    weight_cache: tuple | None = field(default=None, repr=False)
    calibrating: bool = False  # 16-bit math, amaxes recorded: the run's first step

    @classmethod
    def standalone(
        cls, recipe: Fp8Recipe, scales: tuple[float, float, float], *, device, use_kernel: bool
    ) -> Fp8Slot:
        """A slot with fixed scales and its own amaxes, outside any model (tests, benchmarks)."""
        from .training import Fp8Training

        state = Fp8Training(["linear"], recipe, device=torch.device(device), use_kernel=use_kernel)
        state.scale.copy_(torch.tensor([scales]))
        state.scale_inv.copy_(state.scale.reciprocal())
        state.slots[0].calibrating = False
        return state.slots[0]

    def weight_fp8(
        self, weight: torch.Tensor, *, record: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(W8 (N, K), W8^T (K, N) contiguous), cast on first use after an update. The key also
        holds the weight's storage and version, so a weight changed behind the update's back (a
        checkpoint load) is cast again rather than served stale; a cast made by an evaluation
        pass is made again when training needs the weight's amax."""
        key = (weight.data_ptr(), weight._version, weight.shape)
        cache = self.weight_cache
        if cache is None or cache[0] != key or (record and not cache[1]):
            w8, w8_t = cast_to_fp8(
                weight.detach(),
                self.scale[WEIGHT],
                self.amax[WEIGHT] if record else None,
                self.recipe.dtypes()[0],
                transpose=True,
                use_kernel=self.use_kernel,
            )
            self.weight_cache = (key, record, w8, w8_t)
        return self.weight_cache[2], self.weight_cache[3]


def _record_amax(amax: torch.Tensor, tensor: torch.Tensor) -> None:
    amax.copy_(torch.maximum(amax, tensor.detach().abs().amax().float()))


class _CalibratingLinear(torch.autograd.Function):
    """F.linear that records the amaxes its FP8 form would: input, weight, output gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, slot: Fp8Slot, record: bool):
        if record:
            _record_amax(slot.amax[INPUT], x)
            _record_amax(slot.amax[WEIGHT], weight)
        ctx.slot, ctx.record, ctx.has_bias = slot, record, bias is not None
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        if ctx.record:
            _record_amax(ctx.slot.amax[GRAD_OUTPUT], grad)
        grad_rows, x_rows = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        grad_bias = (
            grad_rows.sum(dim=0, dtype=torch.float32).to(grad.dtype) if ctx.has_bias else None
        )
        return grad @ weight, grad_rows.t() @ x_rows, grad_bias, None, None


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, slot: Fp8Slot, record: bool):
        forward_dtype, backward_dtype = slot.recipe.dtypes()
        rows = x.reshape(-1, x.shape[-1])
        rows = rows if rows.is_contiguous() else rows.contiguous()
        x8, x8_t = cast_to_fp8(
            rows,
            slot.scale[INPUT],
            slot.amax[INPUT] if record else None,
            forward_dtype,
            transpose=slot.recipe.fp8_wgrad,
            use_kernel=slot.use_kernel,
        )
        w8, w8_t = slot.weight_fp8(weight, record=record)
        # Fast accumulation in the forward only, as Transformer Engine and torchao: the gradients
        # keep the split accumulator.
        y = torch._scaled_mm(
            x8,
            w8.t(),
            scale_a=slot.scale_inv[INPUT],
            scale_b=slot.scale_inv[WEIGHT],
            bias=bias,
            out_dtype=x.dtype,
            use_fast_accum=True,
        )
        ctx.slot, ctx.record = slot, record
        ctx.has_bias, ctx.weight_dtype = bias is not None, weight.dtype
        ctx.x_shape = x.shape
        # The weight gradient reads x^T in FP8, or x itself in 16 bits (--no-fp8-wgrad).
        ctx.save_for_backward(x8_t if slot.recipe.fp8_wgrad else rows, w8_t)
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        slot: Fp8Slot = ctx.slot
        x_saved, w8_t = ctx.saved_tensors
        grad_rows = grad.reshape(-1, grad.shape[-1])
        grad_rows = grad_rows if grad_rows.is_contiguous() else grad_rows.contiguous()
        g8, g8_t = cast_to_fp8(
            grad_rows,
            slot.scale[GRAD_OUTPUT],
            slot.amax[GRAD_OUTPUT] if ctx.record else None,
            slot.recipe.dtypes()[1],
            transpose=slot.recipe.fp8_wgrad,
            use_kernel=slot.use_kernel,
        )
        grad_x = torch._scaled_mm(
            g8,
            w8_t.t(),  # W (N, K), column-major
            scale_a=slot.scale_inv[GRAD_OUTPUT],
            scale_b=slot.scale_inv[WEIGHT],
            out_dtype=grad.dtype,
        )
        if slot.recipe.fp8_wgrad:
            grad_w = torch._scaled_mm(
                g8_t,  # grad^T (N, M), row-major
                x_saved.t(),  # x (M, K), column-major
                scale_a=slot.scale_inv[GRAD_OUTPUT],
                scale_b=slot.scale_inv[INPUT],
                out_dtype=ctx.weight_dtype,
            )
        else:
            grad_w = (grad_rows.t() @ x_saved).to(ctx.weight_dtype)
        grad_bias = None
        if ctx.has_bias:
            grad_bias = grad_rows.sum(dim=0, dtype=torch.float32).to(grad.dtype)
        return grad_x.view(ctx.x_shape), grad_w, grad_bias, None, None


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    slot: Fp8Slot,
    *,
    record: bool,
) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T + bias (N,) with FP8 operands; out in x's dtype. record: fold
    this call's amaxes into the step's (training; an evaluation pass leaves the scaling alone)."""
    function = _CalibratingLinear if slot.calibrating else _Fp8Linear
    return function.apply(x, weight, bias, slot, record)
