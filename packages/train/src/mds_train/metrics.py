"""What a run reports: Megatron's interval and validation lines, TFLOPs, MFU, metrics, TensorBoard.

The interval line keeps Megatron-DeepSpeed's field names and formats (README: "Log lines") and adds
tokens per second, MFU and an ETA at its end; TensorBoard scalars use Megatron's tag names.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Dense bf16/fp16 peaks (TFLOP/s per GPU) by the device name's marker, for MFU; --peak-tflops wins.
_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def megatron_flops_per_iteration(
    *,
    global_batch: int,
    seq_length: int,
    num_layers: int,
    hidden_size: int,
    padded_vocab_size: int,
    recompute: bool,
) -> float:
    """Narayanan et al. (2021) eq. 3, as BS Megatron: 24 f B s l h^2 (1 + s/6h + V/16lh)."""
    f = 4 if recompute else 3
    s, h, layers = seq_length, hidden_size, num_layers
    return (
        24
        * f
        * global_batch
        * s
        * layers
        * h
        * h
        * (1 + s / (6 * h) + padded_vocab_size / (16 * layers * h))
    )


def default_peak_tflops(params_dtype: str) -> float | None:
    if params_dtype == "float32" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for marker, peak in _PEAK_TFLOPS.items() if marker in name), None)


@dataclass
class IntervalStats:
    """Sums since the last interval line; Megatron resets them after printing."""

    loss_sum: float = 0.0
    num_loss_iterations: int = 0
    num_iterations: int = 0
    num_skipped: int = 0
    num_nan: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, *, loss: float, skipped: bool) -> None:
        self.num_iterations += 1
        if skipped:
            self.num_skipped += 1
        if not math.isfinite(loss):
            self.num_nan += 1
        elif not skipped:
            self.loss_sum += loss
            self.num_loss_iterations += 1

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(1, self.num_loss_iterations)


def _fields(pairs: list[tuple[str, str]]) -> str:
    # Megatron writes "iteration" without a colon: ` iteration      100/    1000 | ...`.
    return "".join(
        f" {name} {value} |" if name == "iteration" else f" {name}: {value} |"
        for name, value in pairs
    )


def interval_line(
    *,
    iteration: int,
    train_iters: int,
    consumed_samples: int,
    consumed_tokens: int,
    ms_per_iteration: float,
    learning_rate: float,
    global_batch: int,
    stats: IntervalStats,
    loss_scale: float | None,
    grad_norm: float | None,
    seq_length: int,
    tflops: float,
    mfu: float | None,
    eta_seconds: float,
) -> str:
    samples_per_second = global_batch / (ms_per_iteration / 1000.0)
    pairs = [
        ("iteration", f"{iteration:8d}/{train_iters:8d}"),
        ("consumed samples", f"{consumed_samples:12d}"),
        ("consumed tokens", f"{consumed_tokens:12d}"),
        ("elapsed time per iteration (ms)", f"{ms_per_iteration:.1f}"),
        ("learning rate", f"{learning_rate:.3E}"),
        ("global batch size", f"{global_batch:5d}"),
    ]
    if stats.num_loss_iterations:
        pairs.append(("lm loss", f"{stats.mean_loss:.6E}"))
    if loss_scale is not None:
        pairs.append(("loss scale", f"{loss_scale:.1f}"))
    if grad_norm is not None:
        pairs.append(("grad norm", f"{grad_norm:.3f}"))
    pairs += [
        ("number of skipped iterations", f"{stats.num_skipped:3d}"),
        ("number of nan iterations", f"{stats.num_nan:3d}"),
        ("samples per second", f"{samples_per_second:.3f}"),
        ("tokens per second", f"{samples_per_second * seq_length:.1f}"),
        ("TFLOPs", f"{tflops:.2f}"),
    ]
    if mfu is not None:
        pairs.append(("MFU", f"{mfu:.1%}"))
    pairs.append(("ETA", _duration(eta_seconds)))
    return _fields(pairs)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def validation_lines(prefix: str, loss: float) -> list[str]:
    """Megatron's framed block (also for test data): ` validation loss at {prefix} | ... | `."""
    text = (
        f" validation loss at {prefix} | lm loss value: {loss:.6E} | "
        f"lm loss PPL: {math.exp(min(20.0, loss)):.6E} | "
    )
    rule = "-" * (len(text) + 1)
    return [rule, text, rule]


class MetricsWriter:
    """metrics.jsonl (a JSON object per event) and, with --tensorboard-dir, TensorBoard scalars."""

    def __init__(self, *, output_dir: Path | None, tensorboard_dir: Path | None, queue_size: int):
        self._jsonl = None
        if output_dir is not None:
            output_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(output_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._tensorboard = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ValueError(
                    "--tensorboard-dir needs the tensorboard package: pip install tensorboard"
                ) from None
            self._tensorboard = SummaryWriter(log_dir=str(tensorboard_dir), max_queue=queue_size)

    def record(self, event: dict) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(event) + "\n")
            self._jsonl.flush()

    def scalars(self, values: dict[str, float], *, step: int) -> None:
        if self._tensorboard is None:
            return
        for tag, value in values.items():
            if value is not None and math.isfinite(value):
                self._tensorboard.add_scalar(tag, value, step)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tensorboard is not None:
            self._tensorboard.close()
