"""Resuming from a checkpoint that mds-merge-mp reshaped to this run's TP/PP, at any DP.

Its weights are DeepSpeed files of this topology (the engine loads them); its optimizer state is
topology-free (mds_checkpoint's universal layout: whole fp32 masters and Adam moments per
parameter). Each rank takes its tensor-parallel slice of every parameter and puts it where this
run's optimizer keeps it: torch's AdamW (fp32, ZeRO-0: the parameter is the master), mds-train's
`MasterWeightAdamW` (bf16, ZeRO-0), or DeepSpeed's ZeRO-1/2 and BF16 optimizers through their
fragment mappings (`param._hp_mapping`, the ones DeepSpeed's own universal loader fills).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from mds_model import ParallelGroups

from .master_weights import MasterWeightAdamW


def restore_optimizer_state(
    engine: Any,
    optimizer: torch.optim.Optimizer,
    groups: ParallelGroups,
    path: Path,
    *,
    num_layers: int,
) -> int:
    """Fills this rank's optimizer from `path/zero`; returns the step it resumes after."""
    from mds_checkpoint import UniversalState, plain_parameter_name

    state = UniversalState(path)
    is_pipeline = hasattr(engine.module, "tied_modules")
    touched_deepspeed = False
    for engine_name, param in engine.module.named_parameters():
        name = plain_parameter_name(engine_name, num_layers=num_layers, pipeline=is_pipeline)
        rows = param.shape[0] * groups.tp_size if name.endswith("word_embeddings.weight") else 0
        values = state.shard(
            name, tp_rank=groups.tp_rank, tp_size=groups.tp_size, padded_vocab_size=rows
        )
        if tuple(values["fp32"].shape) != tuple(param.shape):
            raise ValueError(
                f"{path}: {name} is {tuple(values['fp32'].shape)} for TP rank {groups.tp_rank}, "
                f"this run's parameter is {tuple(param.shape)}"
            )
        if hasattr(param, "_hp_mapping"):
            _set_deepspeed_fragment(engine.optimizer, param, values, state.step)
            touched_deepspeed = True
        elif isinstance(optimizer, MasterWeightAdamW):
            _set_master(optimizer, param, values, state.step)
        else:
            _set_torch_state(optimizer, param, values, state.step)
    if touched_deepspeed and hasattr(engine.optimizer, "_hp_optimizer_states_linked"):
        engine.optimizer._hp_optimizer_states_linked = False  # relink views into the new state
    if isinstance(optimizer, MasterWeightAdamW):
        optimizer.refresh_model_params()
    return state.step


def _adam_state(values: dict[str, torch.Tensor], like: torch.Tensor, step: int, group: dict):
    on_device = group.get("fused") or group.get("capturable")
    return {
        "step": torch.tensor(float(step), device=like.device if on_device else "cpu"),
        "exp_avg": values["exp_avg"].to(like.device, like.dtype).clone(),
        "exp_avg_sq": values["exp_avg_sq"].to(like.device, like.dtype).clone(),
    }


def _group_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> tuple[int, int]:
    for g, group in enumerate(optimizer.param_groups):
        for i, p in enumerate(group["params"]):
            if p is param:
                return g, i
    raise ValueError("a model parameter is not in the optimizer; cannot restore its state")


@torch.no_grad()
def _set_torch_state(optimizer, param, values, step: int) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer) or "fp32" not in values:
        raise ValueError("this run's optimizer cannot take reshaped optimizer state")
    g, _ = _group_of(optimizer, param)
    param.copy_(values["fp32"].to(param.dtype))
    optimizer.state[param] = _adam_state(values, param, step, optimizer.param_groups[g])


@torch.no_grad()
def _set_master(optimizer: MasterWeightAdamW, param, values, step: int) -> None:
    g, i = _group_of(optimizer, param)
    master = optimizer.masters[g][i]
    master.copy_(values["fp32"].to(master.device))
    inner_group = optimizer.inner.param_groups[g]
    optimizer.inner.state[master] = _adam_state(values, master, step, inner_group)


@torch.no_grad()
def _set_deepspeed_fragment(ds_optimizer, param, values, step: int) -> None:
    mapping = param._hp_mapping
    if mapping is None:  # no fragment of this parameter in this DP rank's partition
        return
    lp = mapping.lp_fragment_address
    hp = mapping.hp_fragment_address
    mapping.hp_fragment.copy_(values["fp32"].flatten().narrow(0, lp.start, lp.numel))
    base = ds_optimizer.optimizer
    flat = base.param_groups[mapping.param_group_index]["params"][0]
    state = base.state[flat]
    if "exp_avg" not in state:
        state.update(
            _adam_state(
                {"exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)},
                flat,
                step,
                base.param_groups[mapping.param_group_index],
            )
        )
    state["step"].fill_(float(step))
    for key in ("exp_avg", "exp_avg_sq"):
        fragment = values[key].flatten().narrow(0, lp.start, lp.numel)
        state[key].narrow(0, hp.start, hp.numel).copy_(fragment)
