"""The fp16 dynamic loss scaler of a DeepSpeed ZeRO run, read as a topology-free JSON record.

DeepSpeed 0.19's ZeRO-1/2 (`stage_1_and_2.py`, also the pipeline engine's fp16 optimizer) and
stage-3 optimizers pickle their `DynamicLossScaler` into every partition file's
`optimizer_state_dict` (`loss_scaler`, with `dynamic_loss_scale` True); bf16, fp32 and static
fp16 runs have `dynamic_loss_scale` False. The overflow test is all-reduced over the data- and
model-parallel ranks, so every rank's scaler holds the same state, whatever the topology.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .ptfile import Missing

# What DeepSpeed's scaler changes as it runs (restored by mds-train), then its settings (the
# resuming run's flags choose those; kept for the record).
STATE_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")
SETTING_FIELDS = (
    "scale_factor",
    "scale_window",
    "min_scale",
    "delayed_shift",
    "consecutive_hysteresis",
)


def loss_scaler_record(optimizer_state_dict: dict[str, Any], where: Path) -> dict | None:
    """The dynamic scaler of one ZeRO partition file as plain numbers; None without one."""
    if not optimizer_state_dict.get("dynamic_loss_scale"):
        return None
    scaler = optimizer_state_dict.get("loss_scaler")
    fields = _fields(scaler)
    missing = [name for name in STATE_FIELDS if name not in fields]
    if missing:
        raise ValueError(
            f"{where}: dynamic_loss_scale is set but its loss_scaler has no {', '.join(missing)}"
        )
    return {
        name: _plain(fields[name]) for name in (*STATE_FIELDS, *SETTING_FIELDS) if name in fields
    }


def agreed_record(records: dict[Path, dict | None]) -> dict | None:
    """The one record every partition file holds; ValueError naming two files that differ."""
    if not records:
        return None
    paths = sorted(records)
    first = records[paths[0]]
    for path in paths[1:]:
        if records[path] != first:
            raise ValueError(
                f"{path}: its fp16 loss scaler {records[path]} differs from {paths[0].name}'s "
                f"{first}; the partition files are not of one checkpoint"
            )
    return first


def _fields(scaler: Any) -> dict[str, Any]:
    """The attributes of DeepSpeed's scaler (ptfile's `Missing` stand-in, or the class itself)."""
    if isinstance(scaler, Missing):
        return scaler.state if isinstance(scaler.state, dict) else {}
    return dict(vars(scaler)) if hasattr(scaler, "__dict__") else {}


def _plain(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):  # a tensor in the file
        value = value.item()
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return float(value)
