"""Mutable training progress in one object, checkpointed whole, and every rank's RNG states.

Megatron keeps these in `args` and module globals; here `TrainingState` is the single record of
iteration, consumed samples and tokens, the schedule's sample count and the NaN/skip counters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from mds_checkpoint import Progress
from mds_model import RNGStatesTracker


@dataclass
class TrainingState(Progress):
    """The counters of meta.json's progress (`mds_checkpoint.meta.Progress`), updated in place
    as the run goes; saved whole in every checkpoint."""


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
