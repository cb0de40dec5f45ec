"""Resuming from a checkpoint that mds-merge-mp reshaped to this run's TP/PP, at any DP.

Its weights are DeepSpeed files of this topology (the engine loads them); its optimizer state is
topology-free (mds_checkpoint's universal layout: whole fp32 masters and Adam moments per
parameter). Each rank takes its tensor-parallel slice of every parameter and puts it where this
run's optimizer keeps it: torch's AdamW (fp32, ZeRO-0: the parameter is the master), mds-train's
`MasterWeightAdamW` (bf16, ZeRO-0) and `ShardedMasterAdamW` (bf16, ZeRO-1), or DeepSpeed's
ZeRO-1/2 and BF16 optimizers through their fragment mappings (`param._hp_mapping`, the ones
DeepSpeed's own universal loader fills; every DeepSpeed internal used here is wrapped in
deepspeed_engine.py).
At ZeRO-3 (`DeepSpeedZeroOptimizer_Stage3`) DeepSpeed cannot load these files at all, so the
weights go in here too: each rank's DP partition of its TP slice, as DeepSpeed's stage-3 universal
loader (`load_hp_checkpoint_state_from_checkpoint_dir_stage3`) cuts it. An fp16 source's dynamic
loss scaler (meta.json's `optimizer.loss_scaler`) goes into this run's DeepSpeed scaler.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from mds_model import ParallelGroups

from .deepspeed_engine import (
    Zero3SubGroup,
    dynamic_loss_scaler,
    fragment_of,
    has_fragment_mapping,
    inner_optimizer,
    is_pipeline_engine,
    relink_optimizer_state,
    set_loss_scaler_state,
    zero3_all_partitioned,
    zero3_full_shape,
    zero3_keeps_partitions_on_nvme,
    zero3_partition,
    zero3_sub_groups,
)
from .fully_sharded import DeepSpeedZero3Files
from .master_weights import MasterWeightAdamW
from .rank_files import load_rank_file
from .sharded_master_weights import ShardedMasterAdamW

logger = logging.getLogger(__name__)


def _vocab_rows(name: str) -> bool:
    """Whether a plain-GPT parameter holds the padded vocabulary's rows (re-padded when the TP
    size changes): the word embeddings and the untied output layer."""
    from mds_model.naming import OUTPUT_LAYER, WORD_EMBEDDINGS

    return name in (WORD_EMBEDDINGS, OUTPUT_LAYER)


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
    is_pipeline = is_pipeline_engine(engine)
    touched_deepspeed = False
    for engine_name, param in engine.module.named_parameters():
        name = plain_parameter_name(engine_name, num_layers=num_layers, pipeline=is_pipeline)
        rows = param.shape[0] * groups.tp_size if _vocab_rows(name) else 0
        values = state.shard(
            name,
            tp_rank=groups.tp_rank,
            tensor_model_parallel_size=groups.tp_size,
            padded_vocab_size=rows,
        )
        if tuple(values["fp32"].shape) != tuple(param.shape):
            raise ValueError(
                f"{path}: {name} is {tuple(values['fp32'].shape)} for TP rank {groups.tp_rank}, "
                f"this run's parameter is {tuple(param.shape)}"
            )
        if has_fragment_mapping(param):
            _set_deepspeed_fragment(engine.optimizer, param, values, state.step)
            touched_deepspeed = True
        elif isinstance(optimizer, MasterWeightAdamW):
            _set_master(optimizer, param, values, state.step)
        elif isinstance(optimizer, ShardedMasterAdamW):
            optimizer.set_parameter_state(param, values, state.step)
        else:
            _set_torch_state(optimizer, param, values, state.step)
    if touched_deepspeed:
        relink_optimizer_state(engine.optimizer)
    if isinstance(optimizer, (MasterWeightAdamW, ShardedMasterAdamW)):
        optimizer.refresh_model_params()
    return state.step


def restore_loss_scaler(ds_optimizer: Any, record: dict[str, Any] | None) -> bool:
    """An fp16 source's dynamic loss scaler state into this run's DeepSpeed optimizer's scaler,
    the four fields DeepSpeed's own load brings back (it replaces the whole pickled scaler, so
    the checkpoint's settings too; here the run's flags keep them). Returns whether it did.

    A static `--loss-scale` run and bf16/fp32 runs have no dynamic scaler: nothing to restore.
    """
    if record is None:
        return False
    scaler = dynamic_loss_scaler(ds_optimizer)
    if scaler is None:
        logger.info(
            "the checkpoint's fp16 loss scale %s is not used: this run has no dynamic loss "
            "scaler (static --loss-scale, bf16 or fp32)",
            record.get("cur_scale"),
        )
        return False
    # What DeepSpeed's `DynamicLossScaler` changes as it runs, as mds-merge-mp records it; its
    # settings (window, minimum, hysteresis) stay this run's flags.
    from mds_checkpoint import LOSS_SCALER_STATE_FIELDS as STATE_FIELDS

    missing = [name for name in STATE_FIELDS if name not in record]
    if missing:
        raise ValueError(f"the checkpoint's loss_scaler record has no {', '.join(missing)}")
    set_loss_scaler_state(scaler, **{name: record[name] for name in STATE_FIELDS})
    return True


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
    state = _adam_state(values, master, step, optimizer.inner.param_groups[g])
    optimizer.set_master_state(g, i, values["fp32"], state)


@torch.no_grad()
def _set_deepspeed_fragment(ds_optimizer, param, values, step: int) -> None:
    fragment = fragment_of(param)
    if fragment is None:  # no fragment of this parameter in this DP rank's partition
        return
    fragment.master.copy_(values["fp32"].flatten().narrow(0, fragment.start, fragment.numel))
    base = inner_optimizer(ds_optimizer)
    group = base.param_groups[fragment.group_index]
    flat = group["params"][0]
    state = base.state[flat]
    if "exp_avg" not in state:
        zeros = {"exp_avg": torch.zeros_like(flat), "exp_avg_sq": torch.zeros_like(flat)}
        state.update(_adam_state(zeros, flat, step, group))
    state["step"].fill_(float(step))
    for key in ("exp_avg", "exp_avg_sq"):
        piece = values[key].flatten().narrow(0, fragment.start, fragment.numel)
        state[key].narrow(0, fragment.partition_start, fragment.numel).copy_(piece)


def restore_zero3(
    engine: Any, groups: ParallelGroups, path: Path, *, num_layers: int, with_optimizer: bool
) -> dict[str, Any]:
    """A reshaped checkpoint into a ZeRO-3 plain engine: the weights (and with `with_optimizer`
    the fp32 masters, Adam moments and step); returns the mp_rank file's client state.

    DeepSpeed 0.19's stage 3 keeps each parameter as `ds_tensor`, the `ceil(numel / DP)` values
    from `rank * ceil(numel / DP)` of its flattened (zero-padded) tensor; a sub-group's partitions
    lie end to end in `fp16_partitioned_groups_flat[g]` (the ds_tensors are views into it) and in
    `fp32_partitioned_groups_flat[g]` (the masters; the same tensor in fp32 runs), whose torch
    AdamW state holds the moments. The weights-only case takes this TP rank's mp_rank `module`.
    """
    from mds_checkpoint import UniversalState, megatron_flat, plain_parameter_name

    ds_optimizer = engine.optimizer
    own = isinstance(ds_optimizer, DeepSpeedZero3Files)
    if not own and zero3_keeps_partitions_on_nvme(ds_optimizer):
        raise ValueError(f"{path}: a reshaped checkpoint cannot be loaded with ZeRO-3 NVMe offload")
    mp_file = path / f"mp_rank_{groups.tp_rank:02d}_model_states.pt"
    checkpoint = load_rank_file(mp_file, mmap=True)
    state = UniversalState(path) if with_optimizer else None
    weights = None  # with the optimizer state the weights are its fp32 masters
    if state is None:  # (a universal folder's mp_rank files may hold no module at all)
        module = checkpoint["module"]
        weights = megatron_flat(module) if "language_model" in module else module  # earlier: flat
    names = {
        param: plain_parameter_name(name, num_layers=num_layers, pipeline=False)
        for name, param in engine.module.named_parameters()
    }

    def values_of(param) -> dict[str, torch.Tensor]:
        name = names[param]
        shape = tuple(param.shape) if own else zero3_full_shape(param)
        if state is None:
            values = {"fp32": weights[name]}
        else:
            rows = shape[0] * groups.tp_size if _vocab_rows(name) else 0
            values = state.shard(
                name,
                tp_rank=groups.tp_rank,
                tensor_model_parallel_size=groups.tp_size,
                padded_vocab_size=rows,
            )
        if tuple(values["fp32"].shape) != shape:
            raise ValueError(
                f"{path}: {name} is {tuple(values['fp32'].shape)} for TP rank {groups.tp_rank}, "
                f"this run's parameter is {shape}"
            )
        return values

    step = None if state is None else state.step
    if own:  # mds-train's ZeRO-3 (fully_sharded.py) takes whole tensors
        for param in names:
            ds_optimizer.set_parameter_state(param, values_of(param), step)
        ds_optimizer.refresh_model_params()
        return checkpoint
    with zero3_all_partitioned(ds_optimizer):
        for g, sub_group in enumerate(zero3_sub_groups(ds_optimizer)):
            _fill_zero3_sub_group(ds_optimizer, g, sub_group, values_of, step)
    return checkpoint


@torch.no_grad()
def _fill_zero3_sub_group(
    ds_optimizer, g: int, sub_group: Zero3SubGroup, values_of, step: int | None
) -> None:
    master = sub_group.master
    base = inner_optimizer(ds_optimizer)
    if step is not None:
        moments = base.state.setdefault(master, {})
        if "exp_avg" not in moments:
            # outside its step DeepSpeed keeps the masters out of the groups' params
            zeros = {"exp_avg": torch.zeros_like(master), "exp_avg_sq": torch.zeros_like(master)}
            moments.update(_adam_state(zeros, master, step, sub_group.param_group))
        moments["step"].fill_(float(step))
    offset = 0
    for param in sub_group.params:
        part = zero3_partition(ds_optimizer, param)
        size = part.numel
        for key, tensor in values_of(param).items():
            flat = tensor.detach().flatten().to(master.device, torch.float32)
            padded = torch.zeros(size * part.world_size, dtype=flat.dtype, device=flat.device)
            padded[: flat.numel()] = flat
            partition = padded.narrow(0, part.rank * size, size)
            if key == "fp32":
                part.local.copy_(partition.to(part.local.dtype))
                master.narrow(0, offset, size).copy_(partition)
            else:
                base.state[master][key].narrow(0, offset, size).copy_(partition)
        offset += size
    if offset != master.numel():  # DeepSpeed laid its partitions out otherwise
        raise RuntimeError(
            f"ZeRO-3 sub-group {g} holds {master.numel()} values, its parameters' partitions "
            f"{offset}"
        )
