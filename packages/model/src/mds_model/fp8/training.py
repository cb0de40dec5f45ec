"""FP8 training of a built model: `enable_fp8` gives every tensor-parallel linear of its transformer
layers an `Fp8Slot` (the output layer and attention's own matmuls stay 16-bit, as upstream's
Transformer Engine layers), and returns the `Fp8Training` that owns their scaling state.

The state is one tensor per quantity for all linears of this rank: the amaxes of the current step
(num_linears, 3), their history (amax_history_len, num_linears, 3) with the most recent step first,
and the scales. `update` runs once per optimizer step, after it: amaxes are reduced (max) over the
tensor- and data-parallel groups, as Transformer Engine over upstream's amax-reduction group (TP x
DP ranks of a pipeline stage), so every replica scales alike and one replica's saved state is
everyone's. Transformer Engine updates after every micro-batch's forward; here the scales change
only between optimizer steps, so all micro-batches of a step and a recompute cast alike. The first
step only records amaxes (linear.py: calibration); its update sets the first scales whatever the
interval.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .linear import Fp8Slot
from .recipe import NUM_ROLES, Fp8Recipe, updated_scales

STATE_VERSION = 1
SCALE_ALIGNMENT = 4  # fp32 elements in 16 bytes


class Fp8Training:
    """The scaling state of one rank's FP8 linears, and its per-step update."""

    def __init__(
        self,
        names: list[str],
        recipe: Fp8Recipe,
        *,
        device: torch.device,
        use_kernel: bool,
    ) -> None:
        self.names, self.recipe = names, recipe
        shape = (len(names), NUM_ROLES)
        self.amax = torch.zeros(shape, dtype=torch.float32, device=device)
        self.amax_history = torch.zeros(
            (recipe.amax_history_len, *shape), dtype=torch.float32, device=device
        )
        self.scale = torch.ones(shape, dtype=torch.float32, device=device)
        # cuBLASLt reads each dequantizing scale through its own 16-byte-aligned pointer.
        self.padded_scale_inv = torch.ones(
            (*shape, SCALE_ALIGNMENT), dtype=torch.float32, device=device
        )
        self.maxima = torch.tensor(recipe.role_maxima(), dtype=torch.float32, device=device)
        self.slots = [self._slot(index, use_kernel) for index in range(len(names))]
        self._set_calibrating(True)

    def _set_calibrating(self, calibrating: bool) -> None:
        self.calibrating = calibrating
        for slot in self.slots:
            slot.calibrating = calibrating

    def _slot(self, index: int, use_kernel: bool) -> Fp8Slot:
        def views(state: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(state[index, role] for role in range(NUM_ROLES))

        return Fp8Slot(
            self.recipe,
            use_kernel,
            views(self.scale),
            views(self.padded_scale_inv[..., 0]),
            views(self.amax),
        )

    @property
    def scale_inv(self) -> torch.Tensor:
        """(num_linears, 3): 1 / scale, the factor `_scaled_mm` multiplies its result by."""
        return self.padded_scale_inv[..., 0]

    @torch.no_grad()
    def update(self, *, iteration: int, groups: list[dist.ProcessGroup | None]) -> None:
        """After the optimizer step that made `iteration`: the step's amaxes go into the history
        (reduced over `groups`), the scales are recomputed every `interval` iterations, and the
        cached FP8 weights are dropped. Device work only: nothing waits on the host."""
        for group in groups:
            if group is not None and dist.get_world_size(group) > 1:
                dist.all_reduce(self.amax, op=dist.ReduceOp.MAX, group=group)
        self.amax_history.copy_(self.amax_history.roll(1, dims=0))
        self.amax_history[0].copy_(self.amax)
        self.amax.zero_()
        if self.calibrating or iteration % self.recipe.interval == 0:
            scale = updated_scales(self.amax_history, self.scale, self.maxima, self.recipe)
            self.scale.copy_(scale)
            self.scale_inv.copy_(self.scale.reciprocal())
        for slot in self.slots:
            slot.weight_cache = None
        self._set_calibrating(False)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to scale exactly as this one would have (CPU tensors)."""
        return {
            "version": STATE_VERSION,
            "recipe": self.recipe.to_dict(),
            "names": list(self.names),
            "amax": self.amax.cpu(),
            "amax_history": self.amax_history.cpu(),
            "scale": self.scale.cpu(),
            "calibrating": self.calibrating,
        }

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Restores a saved state; returns why it could not (another layout of linears or another
        history length: the scaling then starts afresh), or None."""
        if state.get("version") != STATE_VERSION:
            return f"FP8 scaling state version {state.get('version')!r} is not {STATE_VERSION}"
        if state["names"] != self.names:
            return "the checkpoint's FP8 linears are not this run's (another TP/PP layout)"
        if tuple(state["amax_history"].shape) != tuple(self.amax_history.shape):
            return (
                f"the checkpoint kept {state['amax_history'].shape[0]} steps of amax history, "
                f"this run keeps {self.amax_history.shape[0]} (--fp8-amax-history-len)"
            )
        self.amax.copy_(state["amax"])
        self.amax_history.copy_(state["amax_history"])
        self.scale.copy_(state["scale"])
        self.scale_inv.copy_(self.scale.reciprocal())
        self._set_calibrating(state["calibrating"])
        for slot in self.slots:
            slot.weight_cache = None
        return None


def enable_fp8(model: nn.Module, recipe: Fp8Recipe, *, use_kernel: bool) -> Fp8Training:
    """Turns on FP8 for `model`'s tensor-parallel linears (in `named_modules` order, which is the
    same on every rank of a stage) and returns their scaling state, on the model's device."""
    from ..layers import ColumnParallelLinear, RowParallelLinear  # layers imports fp8.linear

    linears = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, ColumnParallelLinear | RowParallelLinear)
    ]
    if not linears:
        raise ValueError("FP8 needs tensor-parallel linear layers; this model has none")
    device = linears[0][1].weight.device
    training = Fp8Training(
        [name for name, _ in linears], recipe, device=device, use_kernel=use_kernel
    )
    for (_, module), slot in zip(linears, training.slots, strict=True):
        module.fp8 = slot
    return training
