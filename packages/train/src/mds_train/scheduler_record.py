"""The schedule a checkpoint records, in Megatron-DeepSpeed's `OptimizerParamScheduler.state_dict`
vocabulary, and which schedule a resumed run takes (upstream's `load_state_dict`/`_check_and_set`):

- `--override-opt_param-scheduler`: the flags' schedule, whatever the checkpoint recorded;
- `--use-checkpoint-opt_param-scheduler`: the checkpoint's (its weight decay must be the flags');
- neither: the two must agree, else one line naming the value, both sides and the two flags.

Upstream's own checkpoints keep the record with its progress in each mp_rank file's
`lr_scheduler`; mds-train writes the record into meta.json (`lr_schedule`) and upstream's
`lr_scheduler` beside DeepSpeed's keys (`mds_checkpoint.upstream_state.scheduler_state`), so that
upstream resumes its runs.
Progress (`num_steps`, `num_tokens`) always comes from the checkpoint (`scheduler_progress`).
"""

from __future__ import annotations

from typing import Any

from mds_checkpoint import scheduler_progress as recorded_progress

from .config import Topology, TrainConfig
from .schedule import LearningRateSchedule, TokenLearningRateSchedule
from .state import TrainingState

# Upstream's names for what _check_and_set compares, with the flags that set each.
FIELDS = {
    "max_lr": "--lr",
    "min_lr": "--min-lr",
    "lr_warmup_steps": "--lr-warmup-iters/samples/fraction (in samples)",
    "lr_warmup_tokens": "--lr-warmup-tokens",
    "lr_decay_steps": "--lr-decay-iters/samples or --train-iters/samples (in samples)",
    "lr_decay_tokens": "--lr-decay-tokens",
    "lr_decay_style": "--lr-decay-style",
    "start_wd": "--weight-decay",
    "end_wd": "--weight-decay",
    "wd_incr_steps": "--train-iters/samples (in samples)",
    "wd_incr_style": "constant weight decay",
}


def schedule_record(config: TrainConfig, topology: Topology) -> dict[str, Any]:
    """The flags' schedule as upstream's scheduler state_dict names it (without progress)."""
    samples = config.sample_lr_schedule(topology)
    opt, batch = config.optimizer, config.batch
    if batch.train_iters is not None:
        wd_incr_steps = batch.train_iters * config.global_batch_size(topology)
    else:
        wd_incr_steps = batch.train_samples
    return {
        "max_lr": samples.max_lr,
        "min_lr": samples.min_lr,
        "lr_warmup_steps": samples.warmup_samples,
        "lr_warmup_tokens": opt.lr_warmup_tokens,
        "lr_decay_steps": samples.decay_samples,
        "lr_decay_tokens": opt.lr_decay_tokens,
        "lr_decay_style": samples.decay_style,
        "start_wd": opt.weight_decay,
        "end_wd": opt.weight_decay,
        "wd_incr_steps": wd_incr_steps,
        "wd_incr_style": "constant",
    }


def scheduler_progress(state: TrainingState, record: dict[str, Any] | None) -> None:
    """The progress of upstream's scheduler state, where a checkpoint recorded it, as the run's
    (`mds_checkpoint.upstream_state.scheduler_progress`)."""
    for name, value in recorded_progress(record).items():
        setattr(state, name, value)


def _normalised(record: dict[str, Any]) -> dict[str, Any]:
    """Upstream's older key names (its load_state_dict reads them too) as the current ones."""
    old = {
        "start_lr": "max_lr",
        "warmup_iter": "lr_warmup_steps",
        "warmup_steps": "lr_warmup_steps",
        "warmup_tokens": "lr_warmup_tokens",
        "end_iter": "lr_decay_steps",
        "decay_steps": "lr_decay_steps",
        "decay_tokens": "lr_decay_tokens",
        "decay_style": "lr_decay_style",
        "num_iters": "num_steps",
    }
    return {old.get(key, key): value for key, value in record.items()}


Schedule = LearningRateSchedule | TokenLearningRateSchedule


def resolve_schedule(
    config: TrainConfig, topology: Topology, recorded: dict[str, Any] | None, *, source: str
) -> tuple[Schedule, dict[str, Any]]:
    """The schedule a run resuming from a checkpoint that recorded `recorded` (None: a fresh run,
    or a checkpoint that recorded none) takes, and its record for the next save."""
    flags = config.lr_schedule(topology)
    options = config.checkpoint
    ours = schedule_record(config, topology)
    if recorded is None or options.override_opt_param_scheduler or options.finetune:
        return flags, ours
    recorded = _normalised(recorded)
    differing = [
        name
        for name in FIELDS
        if name in recorded
        and recorded[name] != ours[name]
        # A constant weight decay never reads its length: upstream's assert there only stops
        # resumes that extend --train-iters, with the same learning rates.
        and not (name == "wd_incr_steps" and recorded.get("wd_incr_style") == "constant")
    ]
    if not differing:
        return flags, ours
    name = differing[0]
    if not options.use_checkpoint_opt_param_scheduler:
        raise ValueError(
            f"{source}: the checkpoint's schedule has {name} {recorded[name]!r}, the flags give "
            f"{ours[name]!r} ({FIELDS[name]}); add --use-checkpoint-opt_param-scheduler to keep "
            "the checkpoint's or --override-opt_param-scheduler to take the flags'"
        )
    for name in ("start_wd", "end_wd", "wd_incr_style"):
        if name in recorded and recorded[name] != ours[name]:
            raise ValueError(
                f"{source}: --use-checkpoint-opt_param-scheduler: the checkpoint's {name} is "
                f"{recorded[name]!r} and mds-train's weight decay is constant --weight-decay "
                f"{ours[name]!r}; give --weight-decay {recorded[name]!r} (constant only)"
            )
    values = {**ours, **{key: recorded[key] for key in FIELDS if key in recorded}}
    samples = LearningRateSchedule(
        max_lr=float(values["max_lr"]),
        min_lr=float(values["min_lr"]),
        warmup_samples=values["lr_warmup_steps"],
        decay_samples=values["lr_decay_steps"],
        decay_style=values["lr_decay_style"],
    )
    if values["lr_warmup_tokens"] is None and values["lr_decay_tokens"] is None:
        return samples, values
    tokens = TokenLearningRateSchedule(
        samples=samples,
        warmup_tokens=values["lr_warmup_tokens"],
        decay_tokens=values["lr_decay_tokens"],
    )
    return tokens, values
