"""Megatron's learning-rate schedule and batch-size ramp-up, as pure functions of counted samples.

The schedule is BS Megatron-DeepSpeed's `AnnealingLR` (README: "Learning-rate schedule"): it counts
samples of applied steps, warms up linearly from 0 (so the first iteration runs at lr 0), then
decays to `min_lr` by a linear, cosine or inverse-square-root rule. `TokenLearningRateSchedule` is
deepspeedai/Megatron-DeepSpeed's token variant (`--lr-warmup-tokens`, `--lr-decay-tokens`). The
ramp-up is Megatron's `RampupBatchsizeNumMicroBatches` (README: "Batch-size ramp-up").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

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
        # deepspeedai/Megatron-DeepSpeed's get_lr ends every decay, inverse-square-root's too,
        # at min_lr past its length (Megatron-LM tests the style first and never ends it).
        if num_samples > self.decay_samples:
            return self.min_lr
        if self.decay_style == "inverse-square-root":
            warmup = max(self.warmup_samples, 1)
            return max(
                self.min_lr, self.max_lr * math.sqrt(warmup) / math.sqrt(max(num_samples, 1))
            )
        ratio = (num_samples - self.warmup_samples) / (self.decay_samples - self.warmup_samples)
        if self.decay_style == "linear":
            coefficient = 1.0 - ratio
        else:
            coefficient = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + (self.max_lr - self.min_lr) * coefficient

    def lr_at(self, progress: ScheduleProgress) -> float:
        return self.lr(progress.lr_samples)


class ScheduleProgress(Protocol):
    """What a schedule reads of the training state (state.TrainingState)."""

    lr_samples: int  # upstream's num_steps: samples of the applied steps
    lr_tokens: int  # upstream's num_tokens: tokens consumed before the last applied step
    lr_warmup_end_tokens: int | None  # lr_tokens when a sample warmup ended


@dataclass(frozen=True, kw_only=True)
class TokenLearningRateSchedule:
    """Megatron-DeepSpeed's `OptimizerParamScheduler.get_lr` with `--lr-warmup-tokens` or
    `--lr-decay-tokens`: each length that is given in tokens is measured in tokens, the other in
    samples (`samples`). With a token decay after a sample warmup, the warmup's length in tokens is
    the token count at the step that ended it, as upstream records it (`lr_warmup_end_tokens`).

    Upstream's `step()` reads `args.consumed_train_tokens` while DeepSpeed's `engine.step()` runs,
    before the train loop adds the iteration's tokens: `lr_tokens` lags one iteration behind."""

    samples: LearningRateSchedule
    warmup_tokens: int | None
    decay_tokens: int | None

    def __post_init__(self) -> None:
        if self.warmup_tokens is not None and self.warmup_tokens < 0:
            raise ValueError("--lr-warmup-tokens must be >= 0")
        if self.warmup_tokens is not None and self.decay_tokens is None:
            if self.samples.warmup_samples > 0:  # upstream's decay ratio would go negative
                raise ValueError(
                    "give --lr-warmup-tokens or --lr-warmup-iters/samples/fraction, not both"
                )
        if self.decay_tokens is None or self.samples.decay_style in ("constant",):
            return
        if self.warmup_tokens is None and self.samples.warmup_samples == 0:
            if self.samples.decay_style != "inverse-square-root":
                raise ValueError(
                    "--lr-decay-tokens needs a warmup (Megatron-DeepSpeed fails without one): "
                    "give --lr-warmup-tokens"
                )
        elif self.warmup_tokens is not None and self.decay_tokens <= self.warmup_tokens:
            raise ValueError(
                f"--lr-decay-tokens ({self.decay_tokens}) must be larger than --lr-warmup-tokens "
                f"({self.warmup_tokens})"
            )

    @property
    def warmup_samples(self) -> int:
        return self.samples.warmup_samples

    def lr_at(self, progress: ScheduleProgress) -> float:
        sched, steps, tokens = self.samples, progress.lr_samples, progress.lr_tokens
        max_lr, min_lr = sched.max_lr, sched.min_lr
        warmup_tokens = self.warmup_tokens
        if warmup_tokens is None and self.decay_tokens is not None:
            warmup_tokens = progress.lr_warmup_end_tokens
        if warmup_tokens is None:
            if sched.warmup_samples > 0 and steps <= sched.warmup_samples:
                return max_lr * steps / sched.warmup_samples
        elif warmup_tokens > 0 and tokens <= warmup_tokens:
            return max_lr * tokens / warmup_tokens
        if sched.decay_style == "constant":
            return max_lr
        if self.decay_tokens is None:
            if steps > sched.decay_samples:
                return min_lr
        elif tokens > self.decay_tokens:
            return min_lr
        if sched.decay_style == "inverse-square-root":
            if warmup_tokens is None:
                lr = max_lr * math.sqrt(max(sched.warmup_samples, 1)) / math.sqrt(max(steps, 1))
            else:
                lr = max_lr * math.sqrt(max(warmup_tokens, 1)) / math.sqrt(max(tokens, 1))
            return max(min_lr, lr)
        if self.decay_tokens is None:
            ratio = (steps - sched.warmup_samples) / (sched.decay_samples - sched.warmup_samples)
        else:
            ratio = (tokens - warmup_tokens) / (self.decay_tokens - warmup_tokens)
        if sched.decay_style == "linear":
            coefficient = 1.0 - ratio
        else:
            coefficient = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return min_lr + (max_lr - min_lr) * coefficient


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
