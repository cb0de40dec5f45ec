"""The user's `--deepspeed_config`: read, checked against the flags, and folded into the config.

A key of the file that a flag also sets (`zero_optimization.stage` and `--zero-stage`,
`train_batch_size` and `--global-batch-size`, the fp16 section and the loss-scale flags, ...) must
agree with that flag when the user gave it (on the command line or in a `--config` preset); a
default or a derived value yields to the file, which then sets the config's field, so that the
derived DeepSpeed JSON, the log line and meta.json all describe the run the file asks for. With a
ramp-up the file's batch is DeepSpeed's initial value only: upstream Megatron-DeepSpeed calls
`engine.set_train_batch_size()` with the ramp's current batch every iteration, and so does the loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Topology, TrainConfig

logger = logging.getLogger(__name__)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a == b and type(a) is type(b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def _identity(value: Any) -> Any:
    return value


def _log2(value: float) -> float:
    return math.log2(value) if value > 0 else value


@dataclass(frozen=True)
class FlagKey:
    """A key of the DeepSpeed JSON that a flag also sets."""

    path: tuple[str, ...]
    section: str  # TrainConfig's section
    field: str
    flag: str
    to_file: Callable[[Any], Any] = _identity  # the field's value as the file spells it
    from_file: Callable[[Any], Any] = _identity

    @property
    def key(self) -> str:
        return ".".join(self.path)


FLAG_KEYS = (
    FlagKey(("train_micro_batch_size_per_gpu",), "batch", "micro_batch_size", "--micro-batch-size"),
    FlagKey(("gradient_clipping",), "optimizer", "clip_grad", "--clip-grad"),
    FlagKey(("zero_optimization", "stage"), "parallel", "zero_stage", "--zero-stage"),
    FlagKey(("fp16", "enabled"), "precision", "fp16", "--fp16"),
    FlagKey(("bf16", "enabled"), "precision", "bf16", "--bf16"),
    FlagKey(
        ("fp16", "loss_scale"),
        "precision",
        "loss_scale",
        "--loss-scale",
        to_file=lambda v: v or 0,  # DeepSpeed's 0 is dynamic, the flag's unset
        from_file=lambda v: float(v) or None,
    ),
    FlagKey(
        ("fp16", "initial_scale_power"),
        "precision",
        "initial_loss_scale",
        "--initial-loss-scale",
        to_file=_log2,
        from_file=lambda v: 2.0**v,
    ),
    FlagKey(("fp16", "loss_scale_window"), "precision", "loss_scale_window", "--loss-scale-window"),
    FlagKey(("fp16", "hysteresis"), "precision", "hysteresis", "--hysteresis"),
    FlagKey(("fp16", "min_loss_scale"), "precision", "min_loss_scale", "--min-loss-scale"),
    FlagKey(("optimizer", "params", "lr"), "optimizer", "lr", "--lr"),
    FlagKey(("optimizer", "params", "eps"), "optimizer", "adam_eps", "--adam-eps"),
    FlagKey(("optimizer", "params", "weight_decay"), "optimizer", "weight_decay", "--weight-decay"),
)


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


def _lookup(user: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = user
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return None if value == "auto" else value  # "auto": DeepSpeed's word for "the flags say"


def _conflict(source: str, key: str, value: Any, flag: str, ours: Any) -> ValueError:
    given = flag if ours is True else f"{flag} {ours!r}"
    return ValueError(
        f"{source}: {key!r} is {value!r} in the DeepSpeed config but {given} was given; "
        f"remove it from the file or change {flag}"
    )


def resolve_user_config(
    config: TrainConfig,
    user: dict[str, Any],
    topology: Topology,
    *,
    given: frozenset[str],
    source: str,
) -> TrainConfig:
    """`config` with the file's values for the flags not given (`given`: field names); a value
    the file contradicts is an error naming the key and the flag."""
    _check_optimizer_section(user, config, source=source)
    sections = {name: {} for name in ("batch", "optimizer", "parallel", "precision")}
    for entry in FLAG_KEYS:
        value = _lookup(user, entry.path)
        if value is None:
            continue
        ours = getattr(getattr(config, entry.section), entry.field)
        if entry.field in given:
            if not _same(entry.to_file(ours), value):
                raise _conflict(source, entry.key, value, entry.flag, ours)
        else:
            sections[entry.section][entry.field] = entry.from_file(value)
    sections["optimizer"].update(_betas(user, config, given=given, source=source))
    config = dataclasses.replace(
        config,
        **{
            name: dataclasses.replace(getattr(config, name), **fields)
            for name, fields in sections.items()
            if fields
        },
    )
    if config.precision.fp16 and config.precision.bf16:
        raise ValueError(
            f"{source}: the DeepSpeed config and the flags enable both fp16 and bf16; keep one"
        )
    global_batch = _global_batch(config, user, topology, given=given, source=source)
    if global_batch != config.batch.global_batch_size:
        config = dataclasses.replace(
            config, batch=dataclasses.replace(config.batch, global_batch_size=global_batch)
        )
    return config


def _betas(user, config: TrainConfig, *, given: frozenset[str], source: str) -> dict[str, float]:
    betas = _lookup(user, ("optimizer", "params", "betas"))
    if betas is None:
        return {}
    betas = [float(beta) for beta in betas]
    if given & {"adam_beta1", "adam_beta2"}:
        ours = [config.optimizer.adam_beta1, config.optimizer.adam_beta2]
        if betas != ours:
            raise _conflict(source, "optimizer.params.betas", betas, "--adam-beta1/2", ours)
        return {}
    return {"adam_beta1": betas[0], "adam_beta2": betas[1]}


def _check_optimizer_section(user: dict[str, Any], config: TrainConfig, *, source: str) -> None:
    """A file's "optimizer" section makes DeepSpeed build the optimizer: an Adam, our schedule."""
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


def _global_batch(
    config: TrainConfig, user: dict[str, Any], topology: Topology, *, given, source: str
) -> int | None:
    """The global batch the file's train_batch_size / gradient_accumulation_steps say, checked
    against --global-batch-size when given; the config's own when the file says neither."""
    per_step = config.batch.micro_batch_size * topology.data_parallel_size
    implied = []  # (key, the file's value, the global batch it means)
    train_batch = _lookup(user, ("train_batch_size",))
    if train_batch is not None:
        implied.append(("train_batch_size", train_batch, train_batch))
    accumulation = _lookup(user, ("gradient_accumulation_steps",))
    if accumulation is not None and config.batch.rampup_batch_size is None:
        # With a ramp-up it is DeepSpeed's first value only; the ramp sets it every iteration.
        implied.append(("gradient_accumulation_steps", accumulation, accumulation * per_step))
    for key, value, _ in implied:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{source}: {key!r} must be a positive integer, got {value!r}")
    if "global_batch_size" in given:
        ours = config.batch.global_batch_size
        for key, value, batch in implied:
            if batch != ours:
                shown = value if key == "train_batch_size" else f"{value} (a batch of {batch})"
                raise _conflict(source, key, shown, "--global-batch-size", ours)
        return ours
    batches = {batch for _, _, batch in implied}
    if len(batches) > 1:
        raise ValueError(
            f"{source}: train_batch_size {train_batch} is not gradient_accumulation_steps "
            f"{accumulation} x --micro-batch-size {config.batch.micro_batch_size} x "
            f"data-parallel size {topology.data_parallel_size}; fix the DeepSpeed config"
        )
    if not batches:
        return config.batch.global_batch_size
    batch = batches.pop()
    if batch % per_step:
        raise ValueError(
            f"{source}: 'train_batch_size' is {batch}, not a multiple of --micro-batch-size "
            f"{config.batch.micro_batch_size} x data-parallel size {topology.data_parallel_size}"
        )
    return batch
