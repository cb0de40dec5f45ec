"""The DeepSpeed JSON: derived from the training flags by one function, the user's file over it.

A user's `--deepspeed_config` may add what the flags do not say (offload, bucket sizes, overlap);
a key it shares with the derived config must hold the same value, or the run stops naming both.
Deprecated spellings (ZeRO's `"cpu_offload": true`) are translated with a warning.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from .config import Topology, TrainConfig

logger = logging.getLogger(__name__)

# Keys the engine's own logic needs but that flags do not set: a user file may change them freely.
_FREE_KEYS = {"steps_per_print", "wall_clock_breakdown", "timers"}
# The optimizer's settings in a user file, and the flags that say the same.
_OPTIMIZER_PARAMS = {"lr": "--lr", "eps": "--adam-eps", "weight_decay": "--weight-decay"}


def uses_master_weights(config: TrainConfig, topology: Topology) -> bool:
    """bf16 at ZeRO-0 without pipelining: DeepSpeed runs in its fp32 mode over the bf16 model and
    master_weights.MasterWeightAdamW keeps the fp32 copies (DeepSpeed's own bf16 wrapper for
    ZeRO-0 reached 0.48x of the reference's tokens/s on one H200, its BF16 optimizer 0.92x)."""
    return (
        config.precision.bf16
        and config.parallel.zero_stage == 0
        and topology.pipeline_parallel == 1
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
    if config.precision.fp16 or (config.precision.bf16 and topology.pipeline_parallel > 1):
        return 1
    return 0


def derive_deepspeed_config(
    config: TrainConfig, topology: Topology, *, pipeline_entries: dict, client_optimizer: bool
) -> dict[str, Any]:
    """What the flags say, in DeepSpeed's vocabulary. The learning-rate schedule stays ours."""
    precision = config.precision
    num_micro = config.batch_schedule(topology).num_micro_batches_at(0)
    derived: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": config.batch.micro_batch_size,
        "gradient_accumulation_steps": num_micro,
        "train_batch_size": config.batch.micro_batch_size * num_micro * topology.data_parallel,
        "gradient_clipping": config.optimizer.clip_grad,
        "steps_per_print": 2**62,  # our own log line replaces DeepSpeed's
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer synchronizes the device at every forward and every step
        # by default, so the GPU drains twice per iteration; our interval line times the steps.
        "timers": {"throughput": {"enabled": False}},
        "zero_optimization": {"stage": effective_zero_stage(config, topology)},
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
    elif precision.bf16 and not uses_master_weights(config, topology):
        # With master weights DeepSpeed runs in its fp32 mode instead; MasterWeightAdamW then
        # accumulates and averages the gradients in fp32 itself.
        derived["bf16"] = {"enabled": True}
        if effective_zero_stage(config, topology) == 1:
            derived["data_types"] = {"grad_accum_dtype": "fp32"}  # selects the BF16 optimizer
    for key, value in pipeline_entries.items():
        derived[key] = {**derived.get(key, {}), **value}
    return derived


def _log2(scale: float) -> int:
    power = round(math.log2(scale))
    if 2.0**power != scale:
        raise ValueError(f"--initial-loss-scale must be a power of 2, got {scale}")
    return power


def load_user_config(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"{path}: cannot read the DeepSpeed config ({error.strerror})") from None
    try:
        user = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}:{error.lineno}: not valid JSON ({error.msg}); fix the DeepSpeed config"
        ) from None
    if not isinstance(user, dict):
        raise ValueError(f"{path}: the DeepSpeed config must be a JSON object")
    return _translate_deprecated(user, path)


def _translate_deprecated(user: dict[str, Any], path: Path) -> dict[str, Any]:
    zero = user.get("zero_optimization")
    if isinstance(zero, dict) and "cpu_offload" in zero:
        zero = dict(zero)
        if zero.pop("cpu_offload"):
            logger.warning(
                '%s: "cpu_offload": true is deprecated; read as "offload_optimizer": '
                '{"device": "cpu"}',
                path,
            )
            zero.setdefault("offload_optimizer", {"device": "cpu"})
        user = {**user, "zero_optimization": zero}
    return user


def merge_deepspeed_config(
    derived: dict[str, Any], user: dict[str, Any], *, source: str
) -> dict[str, Any]:
    """derived with user's keys added; a key both set must agree (the value "auto" defers)."""
    merged = dict(derived)
    for key, value in user.items():
        if key not in derived or key in _FREE_KEYS or value == "auto":
            merged[key] = derived.get(key, value) if value == "auto" else value
            continue
        ours = derived[key]
        if isinstance(ours, dict) and isinstance(value, dict):
            merged[key] = merge_deepspeed_config(ours, value, source=f"{source}: {key}")
        elif not _same(ours, value):
            raise ValueError(
                f"{source}: {key!r} is {value!r} in the DeepSpeed config but {ours!r} from the "
                "command line; remove it from the file or change the flag"
            )
    return merged


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a == b and type(a) is type(b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def offloads_optimizer(ds_config: dict[str, Any]) -> bool:
    offload = ds_config.get("zero_optimization", {}).get("offload_optimizer") or {}
    return offload.get("device") in ("cpu", "nvme")


def check_user_optimizer(user: dict[str, Any], config: TrainConfig, *, source: str) -> None:
    """A user file's "optimizer" section builds DeepSpeed's optimizer; it must agree with flags."""
    section = user.get("optimizer")
    if section is None:
        return
    if "scheduler" in user:
        raise ValueError(
            f'{source}: remove "scheduler"; the learning-rate schedule comes from --lr-* flags'
        )
    if config.optimizer.optimizer != "adam" or "adam" not in str(section.get("type", "")).lower():
        raise ValueError(
            f"{source}: the optimizer section must be an Adam type with --optimizer adam"
        )
    params = section.get("params", {})
    flags = {"lr": config.optimizer.lr, "eps": config.optimizer.adam_eps}
    flags["weight_decay"] = config.optimizer.weight_decay
    for key, flag_name in _OPTIMIZER_PARAMS.items():
        if key in params and not _same(float(params[key]), float(flags[key])):
            raise ValueError(
                f"{source}: optimizer {key} is {params[key]} but {flag_name} is {flags[key]}; "
                "make them agree"
            )
    betas = params.get("betas")
    ours = [config.optimizer.adam_beta1, config.optimizer.adam_beta2]
    if betas is not None and [float(b) for b in betas] != ours:
        raise ValueError(
            f"{source}: optimizer betas are {betas} but --adam-beta1/--adam-beta2 give {ours}"
        )
