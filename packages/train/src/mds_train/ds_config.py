"""The DeepSpeed JSON: derived from the training flags by one function, the user's file over it.

A user's `--deepspeed_config` (ds_file.py: read, checked against the flags given, folded into the
config) may add what the flags do not say (offload, bucket sizes, overlap) and change what they
only derive.
"""

from __future__ import annotations

import math
from typing import Any

from .config import Topology, TrainConfig

_BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")


def uses_master_weights(config: TrainConfig, topology: Topology) -> bool:
    """bf16 at ZeRO-0 without pipelining: DeepSpeed runs in its fp32 mode over the bf16 model and
    master_weights.MasterWeightAdamW keeps the fp32 copies (DeepSpeed's own bf16 wrapper for
    ZeRO-0 reached 0.48x of the reference's tokens/s on one H200, its BF16 optimizer 0.92x)."""
    return (
        config.precision.bf16
        and config.parallel.zero_stage == 0
        and topology.pipeline_model_parallel_size == 1
    )


def uses_sharded_master_weights(
    config: TrainConfig, topology: Topology, user_ds: dict[str, Any]
) -> bool:
    """bf16 at ZeRO-1 or ZeRO-2 without pipelining, offload or an optimizer named in the user's
    DeepSpeed file: sharded_master_weights.ShardedMasterAdamW keeps this rank's partition of the
    fp32 masters in DeepSpeed's layout and DeepSpeed runs in its fp32 mode at stage 0 (its BF16
    optimizer reached 0.94x of the reference's tokens/s on one H200, 0.55x on a slowed host; its
    ZeRO-2 0.60x)."""
    return (
        config.precision.bf16
        and config.parallel.zero_stage in (1, 2)
        and topology.pipeline_model_parallel_size == 1
        and "optimizer" not in user_ds
        and not offloads_optimizer(user_ds)
    )


def uses_own_zero3(config: TrainConfig, topology: Topology, user_ds: dict[str, Any]) -> bool:
    """bf16 at ZeRO-3 without pipelining, offload or an optimizer named in the user's DeepSpeed
    file: mds-train's ZeRO-3 (fully_sharded.py; FSDP2's FullyShardedAdamW above one
    data-parallel rank, the ZeRO-0 step's SingleRankZero3AdamW at one), DeepSpeed in its fp32
    mode at stage 0 (its stage 3 reached 0.38x of the reference's tokens/s on one H200, 0.24x on
    an H100)."""
    zero = user_ds.get("zero_optimization", {})
    offload_param = (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme")
    return (
        config.precision.bf16
        and config.parallel.zero_stage == 3
        and topology.pipeline_model_parallel_size == 1
        and "optimizer" not in user_ds
        and not offloads_optimizer(user_ds)
        and not offload_param
    )


def deepspeed_optimizer_problem(
    config: TrainConfig, topology: Topology, user_ds: dict[str, Any]
) -> str | None:
    """Why a ZeRO-1/2/3 run's layers cannot be CUDA graphs although its flags allow them: its
    DeepSpeed file keeps DeepSpeed's own optimizer, whose BF16 and ZeRO wrappers invalidated
    the capture (stage 3 gathers each layer's weights in hooks a graph would skip); None
    otherwise."""
    if (
        config.parallel.zero_stage == 0
        or uses_sharded_master_weights(config, topology, user_ds)
        or uses_own_zero3(config, topology, user_ds)
    ):
        return None
    if not config.precision.bf16 or topology.pipeline_model_parallel_size > 1:
        return None  # cuda_graph_problem names these
    return (
        "the DeepSpeed file keeps DeepSpeed's own optimizer (offload_optimizer or an optimizer "
        "section), which breaks the capture"
    )


def effective_zero_stage(config: TrainConfig, topology: Topology) -> int:
    """The ZeRO stage the engine runs; at DP = 1 stages 0 and 1 are the same, above it stage 1
    also shards the optimizer state. Stage 0 runs at stage 1:
    - for a bf16 pipeline, because DeepSpeed's BF16 optimizer (fp32 masters and gradient
      accumulation) needs it;
    - for fp16, because DeepSpeed 0.19's `engine.backward` multiplies the loss by the loss scale
      only for ZeRO optimizers, while its stage-0 fp16 wrappers still divide the gradients by it:
      every update would be 2^32 times too small and the model would not learn (measured on an
      H200: the loss stayed at 10.86 for 30 iterations, no overflow ever seen)."""
    if config.parallel.zero_stage != 0:
        return config.parallel.zero_stage
    if config.precision.fp16 or (
        config.precision.bf16 and topology.pipeline_model_parallel_size > 1
    ):
        return 1
    return 0


def deepspeed_loads_universal(
    config: TrainConfig, topology: Topology, user_ds: dict[str, Any]
) -> bool:
    """`--universal-checkpoint` into one of DeepSpeed's ZeRO-1/2 or BF16 optimizers: DeepSpeed's
    own universal loader fills it (`load_hp_checkpoint_state_from_checkpoint_dir`, through the
    optimizers' `param._hp_mapping`). It restores nothing else: torch's AdamW at ZeRO-0,
    MasterWeightAdamW and ShardedMasterAdamW are not its optimizers, and ZeRO-3 runs fill their
    partitions in reshaped.py (universal_load.py)."""
    return (
        config.checkpoint.universal_checkpoint
        and effective_zero_stage(config, topology) in (1, 2)
        and not uses_sharded_master_weights(config, topology, user_ds)
    )


def derive_deepspeed_config(
    config: TrainConfig,
    topology: Topology,
    *,
    pipeline_entries: dict,
    client_optimizer: bool,
    sharded_master_weights: bool = False,
) -> dict[str, Any]:
    """What the flags say, in DeepSpeed's vocabulary. The learning-rate schedule stays ours.
    With `sharded_master_weights` (uses_sharded_master_weights) the engine's: fp32 mode at stage
    0; without, what DeepSpeed itself would run, as its files record it."""
    precision = config.precision
    stage = 0 if sharded_master_weights else effective_zero_stage(config, topology)
    own_masters = sharded_master_weights or uses_master_weights(config, topology)
    num_micro = config.batch_schedule(topology).num_micro_batches_at(0)
    derived: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": config.batch.micro_batch_size,
        "gradient_accumulation_steps": num_micro,
        "train_batch_size": config.batch.micro_batch_size * num_micro * topology.data_parallel_size,
        "gradient_clipping": config.optimizer.clip_grad,
        "steps_per_print": 2**62,  # our own log line replaces DeepSpeed's
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer synchronizes the device at every forward and every step
        # by default, so the GPU drains twice per iteration; our interval line times the steps.
        "timers": {"throughput": {"enabled": False}},
        "zero_optimization": {"stage": stage},
    }
    if client_optimizer:
        derived["zero_allow_untested_optimizer"] = True  # torch's AdamW is ZeRO-safe
    if precision.fp16:
        derived["fp16"] = {
            "enabled": True,
            "loss_scale": precision.loss_scale or 0,  # 0: dynamic
            "initial_scale_power": _log2(precision.initial_loss_scale),
            "loss_scale_window": precision.loss_scale_window,
            "hysteresis": precision.hysteresis,
            "min_loss_scale": precision.min_loss_scale,
        }
    elif precision.bf16 and not own_masters:
        # With master weights DeepSpeed runs in its fp32 mode instead; MasterWeightAdamW or
        # ShardedMasterAdamW then accumulates and averages the gradients in fp32 itself.
        derived["bf16"] = {"enabled": True}
        if stage == 1:
            derived["data_types"] = {"grad_accum_dtype": "fp32"}  # selects the BF16 optimizer
    if config.checkpoint.universal_checkpoint and stage in (1, 2):
        # as upstream's --universal-checkpoint (megatron/training.py, _create_ds_config_dict)
        derived["checkpoint"] = {"load_universal": True}
    for key, value in pipeline_entries.items():
        derived[key] = {**derived.get(key, {}), **value}
    return derived


def _log2(scale: float) -> int:
    power = round(math.log2(scale))
    if 2.0**power != scale:
        raise ValueError(f"--initial-loss-scale must be a power of 2, got {scale}")
    return power


def merge_deepspeed_config(derived: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """The user's file over the derived config (after ds_file.resolve_user_config, so the keys a
    flag sets agree): the file's other keys win, as derived values yield to it; "auto" takes the
    derived value. The batch keys stay derived: with a ramp-up the file's are DeepSpeed's initial
    values only, which the loop's set_train_batch_size replaces (as upstream). So does the ZeRO
    stage: the file's is the config's already, and the derived one is what the engine must run
    (`effective_zero_stage`: a bf16 pipeline's or fp16's stage 0 is 1). Upstream's bf16 Llama
    scripts write stage 0 in their file; DeepSpeed refuses that stage beside the BF16
    optimizer's fp32 gradient accumulation (`unsupported mix of model_dtype=torch.bfloat16 and
    grad_accum_dtype=torch.float32`). So does bf16: upstream's files enable it, and whether
    DeepSpeed runs its bf16 mode is mds-train's choice (`derive_deepspeed_config`)."""
    merged = _over(derived, user)
    for key in _BATCH_KEYS:
        merged[key] = derived[key]
    merged["zero_optimization"] = {**merged["zero_optimization"], **derived["zero_optimization"]}
    if "bf16" not in derived:
        # The file's `bf16.enabled` is --bf16 already; over mds-train's own fp32 masters DeepSpeed
        # runs in its fp32 mode, and its bf16 mode would cast and wrap what they hold.
        merged.pop("bf16", None)
    return merged


def _over(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    merged = dict(ours)
    for key, value in theirs.items():
        if value == "auto" and key in ours:
            continue
        if isinstance(value, dict) and isinstance(ours.get(key), dict):
            merged[key] = _over(ours[key], value)
        else:
            merged[key] = value
    return merged


def offloads_optimizer(ds_config: dict[str, Any]) -> bool:
    offload = ds_config.get("zero_optimization", {}).get("offload_optimizer") or {}
    return offload.get("device") in ("cpu", "nvme")
