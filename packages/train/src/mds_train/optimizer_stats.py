"""`--log-optimizer-states-to-tensorboard`: Megatron-DeepSpeed's optimizer-state scalars
(training.py, `training_log`): L2 and L1 norms of Adam's second moment, its square root, the first
moment and the weights the optimizer steps, and their largest magnitudes, summed (maxed) over the
data-parallel ranks when ZeRO shards the state and over the tensor- and pipeline-parallel ranks, as
upstream does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Upstream's tags, in its order; the L2 entries are square roots of the summed squares.
SUM_TAGS = (
    "variance_l2",
    "variance_sqrt_l2",
    "momentum_l2",
    "weight_l2",
    "variance_l1",
    "variance_sqrt_l1",
    "momentum_l1",
    "weight_l1",
)
MAX_TAGS = ("variance_abs_max", "variance_sqrt_abs_max", "momentum_abs_max", "weight_abs_max")


def optimizer_state_stats(
    optimizer: torch.optim.Optimizer, groups, *, sharded: bool, device: torch.device
) -> dict[str, float]:
    """`optimizer/<tag>` -> value, the same on every rank (every rank must call it)."""
    inner = getattr(optimizer, "inner", optimizer)  # MasterWeightAdamW steps fp32 masters
    sums = torch.zeros(len(SUM_TAGS), dtype=torch.float64, device=device)
    maxes = torch.zeros(len(MAX_TAGS), dtype=torch.float64, device=device)
    for group in inner.param_groups:
        for param in group["params"]:
            state = inner.state.get(param, {})
            if "exp_avg" not in state or "exp_avg_sq" not in state:
                continue
            variance = state["exp_avg_sq"].detach().float()
            root, momentum = variance.sqrt(), state["exp_avg"].detach().float()
            weight = param.detach().float()
            tensors = (variance, root, momentum, weight)
            squares = [t.norm() ** 2 for t in tensors]
            l1 = [t.norm(p=1) for t in tensors]
            sums += torch.stack(squares + l1).to(device=device, dtype=torch.float64)
            largest = torch.stack([t.abs().max() for t in tensors])
            maxes = torch.maximum(maxes, largest.to(device=device, dtype=torch.float64))
    reduce_over = [groups.tp_group, groups.pp_group]
    if sharded:
        reduce_over.append(groups.dp_group)
    for group in reduce_over:
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(sums, group=group)
            dist.all_reduce(maxes, op=dist.ReduceOp.MAX, group=group)
    values = sums.tolist()
    for index in range(4):  # the L2 norms
        values[index] **= 0.5
    stats = dict(zip(SUM_TAGS, values, strict=True))
    stats.update(zip(MAX_TAGS, maxes.tolist(), strict=True))
    return {f"optimizer/{tag}": value for tag, value in stats.items()}
