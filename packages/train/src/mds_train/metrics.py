"""What a run reports: Megatron's interval and validation lines, TFLOPs, MFU, metrics, TensorBoard.

The interval line keeps Megatron-DeepSpeed's field names and formats (README: "Log lines") and adds
tokens per second, MFU and an ETA at its end; TensorBoard scalars use Megatron's tag names.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from mds_model import GPTConfig
from mds_model.estimate import flops_per_token

# Dense bf16/fp16 peaks (TFLOP/s per GPU) by the device name's marker, for MFU; --peak-tflops wins.
_PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def megatron_flops_per_iteration(config: GPTConfig, *, global_batch: int) -> float:
    """Narayanan et al. (2021) eq. 3 as BS Megatron counts it, 24 f B s l h^2 (1 + s/6h + V/16lh)
    for GPT-2, with the layer's products as `mds-model info` writes them out (grouped keys and
    values, SwiGLU): mds_model.estimate.flops_per_token, f = 4 under full recompute, else 3."""
    recompute = config.activation_checkpointing == "full"
    per_token = flops_per_token(config)
    key = "megatron_with_recompute" if recompute else "megatron_no_recompute"
    return per_token[key] * global_batch * config.seq_length


def default_peak_tflops(params_dtype: str) -> float | None:
    if params_dtype == "float32" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for marker, peak in _PEAK_TFLOPS.items() if marker in name), None)


class IntervalStats:
    """Sums since the last interval line (Megatron resets them after printing), kept on the
    device so that an iteration needs no host synchronisation; `summary()` reads them."""

    def __init__(self, device: torch.device) -> None:
        self.started = time.perf_counter()
        self.num_iterations = 0
        self.num_skipped = 0
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self._num_loss = torch.zeros((), dtype=torch.int64, device=device)
        self._num_nan = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, loss: torch.Tensor, *, skipped: bool) -> torch.Tensor:
        """Counts one iteration; returns its loss's finiteness (a device bool)."""
        finite = torch.isfinite(loss)
        self.num_iterations += 1
        self.num_skipped += int(skipped)
        self._num_nan += (~finite).long()
        if not skipped:
            self._loss_sum += torch.where(finite, loss.double(), 0.0)
            self._num_loss += finite.long()
        return finite

    def summary(self) -> tuple[float | None, int]:
        """(mean loss of the applied iterations with a finite loss, or None; NaN count)."""
        num_loss, num_nan = int(self._num_loss), int(self._num_nan)
        mean = float(self._loss_sum) / num_loss if num_loss else None
        return mean, num_nan


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
    mean_loss: float | None,
    num_skipped: int,
    num_nan: int,
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
    if mean_loss is not None:
        pairs.append(("lm loss", f"{mean_loss:.6E}"))
    if loss_scale is not None:
        pairs.append(("loss scale", f"{loss_scale:.1f}"))
    if grad_norm is not None:
        pairs.append(("grad norm", f"{grad_norm:.3f}"))
    pairs += [
        ("number of skipped iterations", f"{num_skipped:3d}"),
        ("number of nan iterations", f"{num_nan:3d}"),
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


def perplexity(loss: float) -> float:
    """Megatron's exp(min(20, loss)), but NaN for a NaN loss (min(20, nan) is 20 in Python, so
    Megatron prints a finite 4.851652E+08 for a loss that is not a number)."""
    return math.exp(min(20.0, loss)) if not math.isnan(loss) else math.nan


def validation_lines(prefix: str, loss: float) -> list[str]:
    """Megatron's framed block (also for test data): ` validation loss at {prefix} | ... | `."""
    text = (
        f" validation loss at {prefix} | lm loss value: {loss:.6E} | "
        f"lm loss PPL: {perplexity(loss):.6E} | "
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
        """Appends one line of strict JSON: a NaN or infinite value is written as null (Python's
        json would write `NaN`, which JSON readers other than Python's refuse)."""
        if self._jsonl is not None:
            finite = {key: _finite_or_none(value) for key, value in event.items()}
            self._jsonl.write(json.dumps(finite, allow_nan=False) + "\n")
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


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
