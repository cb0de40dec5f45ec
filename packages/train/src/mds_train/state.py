"""Mutable training progress in one object, checkpointed whole, and every rank's RNG states.

Megatron keeps these in `args` and module globals; here `TrainingState` is the single record of
iteration, consumed samples and tokens, the schedule's sample count and the NaN/skip counters.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from mds_model import RNGStatesTracker


@dataclass
class TrainingState:
    iteration: int = 0
    consumed_train_samples: int = 0
    consumed_valid_samples: int = 0
    consumed_train_tokens: int = 0
    lr_samples: int = 0  # AnnealingLR's num_steps: samples of the steps that were applied
    # OptimizerParamScheduler's num_tokens: the tokens consumed before the last applied step's
    # iteration (upstream's step() reads them before its loop counts the iteration's).
    lr_tokens: int = 0
    # Its lr_warmup_tokens as recorded when a warmup in samples ends (a token decay reads it).
    lr_warmup_end_tokens: int | None = None
    skipped_iterations: int = 0
    nan_iterations: int = 0

    def to_dict(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingState:
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(
            **{
                key: None if value is None else int(value)
                for key, value in values.items()
                if key in names
            }
        )


def capture_rng_states(tracker: RNGStatesTracker | None) -> dict[str, Any]:
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": tracker.get_states() if tracker is not None else None,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def restore_rng_states(states: dict[str, Any], tracker: RNGStatesTracker | None) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
    if tracker is not None and states.get("tracker") is not None:
        tracker.set_states(states["tracker"])


def upstream_rng_state(tracker: RNGStatesTracker | None) -> list[dict[str, Any]]:
    """Megatron's `get_rng_state()`, which upstream's save_checkpoint writes as `rng_state` and its
    load_checkpoint restores unless `--no-load-rng`: one element, since every data-parallel rank
    draws alike (upstream without `--data-parallel-random-init`, as mds-train). On DeepSpeed's CPU
    accelerator its `cuda_rng_state` is the CPU generator's."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return [
        {
            "random_rng_state": random.getstate(),
            "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
            "cuda_rng_state": torch.cuda.get_rng_state() if cuda else torch.get_rng_state(),
            "rng_tracker_states": tracker.megatron_states() if tracker is not None else {},
        }
    ]


def restore_upstream_rng_state(states: list[dict[str, Any]], tracker: RNGStatesTracker) -> None:
    """`upstream_rng_state`'s inverse, as upstream's load_checkpoint applies it (the first
    element: no `--data-parallel-random-init`)."""
    state = states[0]
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    else:
        torch.set_rng_state(state["cuda_rng_state"])  # DeepSpeed's CPU accelerator sets it last
    tracker.set_megatron_states(state["rng_tracker_states"])
