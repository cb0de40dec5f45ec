"""Megatron's learning-rate schedule and batch-size ramp-up, as pure functions of counted samples.

The schedule is BS Megatron-DeepSpeed's `AnnealingLR` (README: "Learning-rate schedule"): it counts
samples of applied steps, warms up linearly from 0 (so the first iteration runs at lr 0), then
decays to `min_lr` by a linear, cosine or inverse-square-root rule. The ramp-up is Megatron's
`RampupBatchsizeNumMicroBatches` (README: "Batch-size ramp-up").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root")


@dataclass(frozen=True, kw_only=True)
class LearningRateSchedule:
    """lr(num_samples); warmup and decay lengths count samples, as AnnealingLR's steps."""

    max_lr: float
    min_lr: float
    warmup_samples: int
    decay_samples: int
    decay_style: str

    def __post_init__(self) -> None:
        if self.decay_style not in DECAY_STYLES:
            raise ValueError(f"--lr-decay-style must be one of {', '.join(DECAY_STYLES)}")
        if self.max_lr < 0 or self.min_lr < 0:
            raise ValueError("--lr and --min-lr must be >= 0")
        if self.min_lr > self.max_lr:
            raise ValueError(f"--min-lr ({self.min_lr}) is larger than --lr ({self.max_lr})")
        if self.warmup_samples < 0:
            raise ValueError("the warmup (--lr-warmup-*) must be >= 0")
        if self.decay_style != "constant" and self.decay_samples <= self.warmup_samples:
            raise ValueError(
                f"the decay ({self.decay_samples} samples) must be longer than the warmup "
                f"({self.warmup_samples} samples); check --lr-decay-* and --lr-warmup-*"
            )

    def lr(self, num_samples: int) -> float:
        if self.warmup_samples > 0 and num_samples <= self.warmup_samples:
            return self.max_lr * num_samples / self.warmup_samples
        if self.decay_style == "constant":
            return self.max_lr
        if self.decay_style == "inverse-square-root":
            warmup = max(self.warmup_samples, 1)
            return max(
                self.min_lr, self.max_lr * math.sqrt(warmup) / math.sqrt(max(num_samples, 1))
            )
        if num_samples > self.decay_samples:
            return self.min_lr
        ratio = (num_samples - self.warmup_samples) / (self.decay_samples - self.warmup_samples)
        if self.decay_style == "linear":
            coefficient = 1.0 - ratio
        else:
            coefficient = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + (self.max_lr - self.min_lr) * coefficient


@dataclass(frozen=True, kw_only=True)
class BatchSizeSchedule:
    """The global batch size at a consumed-sample count: constant, or Megatron's linear ramp-up.

    `rampup` is `(start, increment, ramp_samples)` as `--rampup-batch-size`; every batch size on
    the way must be a multiple of micro_batch_size * data_parallel_size.
    """

    global_batch_size: int
    micro_batch_size: int
    data_parallel_size: int
    rampup: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        per_step = self.micro_batch_size * self.data_parallel_size
        if self.global_batch_size % per_step:
            raise ValueError(
                f"--global-batch-size ({self.global_batch_size}) must be a multiple of "
                f"--micro-batch-size ({self.micro_batch_size}) x data-parallel size "
                f"({self.data_parallel_size})"
            )
        if self.rampup is None:
            return
        start, increment, ramp_samples = self.rampup
        if start < 1 or increment < 1 or ramp_samples < 1:
            # 0 samples would divide by zero in Megatron's rule (0 samples per increment).
            raise ValueError("--rampup-batch-size: start, increment and samples must be >= 1")
        difference = self.global_batch_size - start
        if difference < 0 or difference % increment:
            raise ValueError(
                f"--rampup-batch-size: --global-batch-size ({self.global_batch_size}) minus the "
                f"start ({start}) must be a non-negative multiple of the increment ({increment})"
            )
        for size in range(start, self.global_batch_size + 1, increment):
            if size % per_step:
                raise ValueError(
                    f"--rampup-batch-size: batch size {size} on the ramp is not a multiple of "
                    f"--micro-batch-size x data-parallel size ({per_step})"
                )

    def global_batch_at(self, consumed_samples: int) -> int:
        if self.rampup is None:
            return self.global_batch_size
        start, increment, ramp_samples = self.rampup
        num_increments = (self.global_batch_size - start) // increment
        if num_increments == 0 or consumed_samples > ramp_samples:
            return self.global_batch_size
        samples_per_increment = ramp_samples / num_increments
        return start + int(consumed_samples / samples_per_increment) * increment

    def num_micro_batches_at(self, consumed_samples: int) -> int:
        return self.global_batch_at(consumed_samples) // (
            self.micro_batch_size * self.data_parallel_size
        )

    def iterations_for(self, train_samples: int) -> int:
        """Iterations of a `--train-samples` run: as many as fit in it, a partial last batch
        thrown away. That is Megatron's `update_train_iters` (the ramp's iterations, then
        `(train_samples - consumed) // global_batch_size`) whenever the run is at least as long
        as the ramp; a shorter run stops where its samples are consumed, where upstream's
        negative term would cut iterations off the ramp that it still counts in full."""
        if self.rampup is None:
            return train_samples // self.global_batch_size
        iterations = consumed = 0
        while consumed <= self.rampup[2]:
            batch = self.global_batch_at(consumed)
            if consumed + batch > train_samples:
                return iterations
            consumed += batch
            iterations += 1
        return iterations + (train_samples - consumed) // self.global_batch_size
