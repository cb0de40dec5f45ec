"""The training loop: iterations, evaluation, checkpoints and every way a run ends.

Per iteration (Megatron's `train`): set the global batch for the consumed samples (ramp-up),
run its micro-batches through the engine, count samples and tokens, step the learning rate by the
samples of an applied step, log every --log-interval, evaluate every --eval-interval, save every
--save-interval, then check the exits (--exit-interval, --exit-duration-in-mins, the kill switch,
SIGTERM/SIGUSR1) on every rank at once, every iteration (Megatron-LM's DistributedSignalHandler
agrees on signals every iteration too). An exit saves a checkpoint first; a signal that finds
nothing to save (no --save, a NaN loss) ends the run with 128 + its number, as the signal would.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpointing import CheckpointContext, save_checkpoint
from .config import Topology, TrainConfig
from .data import MicroBatches, pipeline_batches
from .deepspeed_engine import current_loss_scale
from .metrics import (
    IntervalStats,
    MetricsWriter,
    interval_line,
    megatron_flops_per_iteration,
    perplexity,
    validation_lines,
)
from .model_setup import TrainingSetup, set_learning_rate
from .optimizer_stats import optimizer_state_stats
from .profiling import StepProfiler
from .schedule import BatchSizeSchedule, LearningRateSchedule, TokenLearningRateSchedule
from .state import TrainingState

logger = logging.getLogger(__name__)

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Iterations between the divergence checks, which need the host to wait for the device: a check
# every iteration would stall the launch queue each time. (The exit checks are host-side values,
# agreed every iteration over a CPU group: run.py's `exit_group`.)
CHECK_INTERVAL = 10


class TrainingDiverged(ValueError):
    """The loss stayed NaN/inf; the last good checkpoint is left as it was."""


@dataclass(frozen=True)
class ExitRequest:
    """Why the run stops before --train-iters: `reason` for the log line, `signum` the signal
    that asked for it (0 for the exit flags and the kill switch)."""

    reason: str
    signum: int = 0


@dataclass
class StepResult:
    loss: torch.Tensor  # 0-d, on the device: read only where a decision needs it
    applied: bool
    grad_norm: torch.Tensor | float | None
    loss_scale: float | None


@dataclass
class Trainer:
    config: TrainConfig
    topology: Topology
    setup: TrainingSetup
    state: TrainingState
    train_iters: int
    lr_schedule: LearningRateSchedule | TokenLearningRateSchedule
    batch_schedule: BatchSizeSchedule
    datasets: object  # mds_indexed_data.DatasetsBuild
    checkpoint: CheckpointContext
    metrics: MetricsWriter
    rank: int
    device: torch.device
    eod_mask_id: int | None
    # A gloo group over every rank (None for one process): the exit checks' all-reduce runs on
    # host memory, so agreeing every iteration never waits for the device.
    exit_group: object = None
    profiler: StepProfiler = field(default_factory=StepProfiler.off)  # --profile
    started: float = field(default_factory=time.time)
    _signal: int = 0
    _num_micro: int = 0

    # --- set-up -----------------------------------------------------------------------------
    def _batches(self, dataset, consumed: int) -> MicroBatches:
        return MicroBatches(
            dataset,
            consumed_samples=consumed,
            micro_batch_size=self.config.batch.micro_batch_size,
            dp_rank=self.setup.groups.dp_rank,
            dp_size=self.topology.data_parallel_size,
            device=self.device,
            eod_mask_id=self.eod_mask_id,
        )

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        self._signal = signum

    # --- the loop ---------------------------------------------------------------------------
    def train(self) -> int:
        """Runs to --train-iters (or an exit); returns the process exit code."""
        for signum in EXIT_SIGNALS:
            signal.signal(signum, self._on_signal)
        if self._kill_switch_present():
            logger.info("Detected kill switch at %s. Exiting", self.config.exit.kill_switch_path)
            return 0
        state, engine = self.state, self.setup.engine
        set_learning_rate(self.setup.optimizer, self.lr_schedule.lr_at(state))
        train_batches = self._batches(self.datasets.train, state.consumed_train_samples)
        if self.setup.is_pipeline:
            train_batches = pipeline_batches(train_batches)
        valid_batches = None
        if self.datasets.valid is not None and self.config.logging.eval_iters > 0:
            valid_batches = self._batches(self.datasets.valid, state.consumed_valid_samples)
        stats = IntervalStats(self.device)
        # NaN-loss iterations in a row, on the device; read every check interval and log line.
        consecutive_nan = torch.zeros((), dtype=torch.int64, device=self.device)
        last = None
        engine.train()
        # Evaluation runs as many micro-batches as training does, even when no iteration runs.
        self._set_num_micro_batches(state.consumed_train_samples)
        if not self._to_train():  # a requeued job that had already finished
            tokens = self.config.batch.train_tokens
            logger.info(
                "training already complete: the checkpoint is at iteration %d and --train-iters "
                "is %d%s; nothing to train, evaluating only",
                state.iteration,
                self.train_iters,
                "" if tokens is None else f" ({state.consumed_train_tokens} tokens of {tokens})",
            )
        while self._to_train():
            self.profiler.step_begin()
            self._set_num_micro_batches(state.consumed_train_samples)
            last = self._train_step(train_batches)
            global_batch = self._num_micro * self.config.batch.micro_batch_size
            global_batch *= self.topology.data_parallel_size
            state.iteration += 1
            if self.setup.fp8 is not None:  # the next step's FP8 scales, on the device
                groups = self.setup.groups
                self.setup.fp8.update(
                    iteration=state.iteration, groups=[groups.tp_group, groups.dp_group]
                )
            state.consumed_train_samples += global_batch
            tokens_before = state.consumed_train_tokens
            state.consumed_train_tokens += global_batch * self.config.model.seq_length
            if last.applied:
                state.lr_samples += global_batch
                state.lr_tokens = tokens_before  # as upstream's scheduler step reads them
                if state.lr_samples == self.lr_schedule.warmup_samples:
                    state.lr_warmup_end_tokens = state.lr_tokens  # a token decay starts here
                set_learning_rate(self.setup.optimizer, self.lr_schedule.lr_at(state))
            else:
                state.skipped_iterations += 1
            finite = stats.add(last.loss, skipped=not last.applied)
            consecutive_nan = torch.where(finite, 0, consecutive_nan + 1)
            logging_now = state.iteration % self.config.logging.log_interval == 0
            if logging_now:
                state.nan_iterations += self._log_interval(stats, last, global_batch)
                stats = IntervalStats(self.device)
            if logging_now or state.iteration % CHECK_INTERVAL == 0:
                self._stop_if_diverged(int(consecutive_nan))
            if (
                valid_batches is not None
                and state.iteration % self.config.logging.eval_interval == 0
            ):
                self._evaluate(valid_batches, f"iteration {state.iteration}", "validation")
            saved = False
            interval = self.config.checkpoint.save_interval
            if interval and state.iteration % interval == 0:
                saved = self._save(last)
            self.profiler.step_end()  # as upstream: after the save, before the exit checks
            request = self._exit_reason()
            if request is not None:
                if not saved:
                    saved = self._save(last)
                return self._exit(request, saved=saved)
        if self.config.checkpoint.save is not None and self.train_iters > 0:
            interval = self.config.checkpoint.save_interval
            if (not interval or state.iteration % interval) and last is not None:
                self._save(last)
        if valid_batches is not None:
            self._evaluate(valid_batches, "the end of training for val data", "validation")
        if self.datasets.test is not None and self.config.logging.eval_iters > 0:
            test_batches = self._batches(self.datasets.test, 0)
            self._evaluate(test_batches, "the end of training for test data", "test")
        return 0

    def _to_train(self) -> bool:
        """Megatron-DeepSpeed's loop condition: iterations left, and tokens if --train-tokens."""
        tokens = self.config.batch.train_tokens
        return self.state.iteration < self.train_iters and (
            tokens is None or self.state.consumed_train_tokens < tokens
        )

    def _set_num_micro_batches(self, consumed: int) -> None:
        num_micro = self.batch_schedule.num_micro_batches_at(consumed)
        if num_micro != self._num_micro:
            micro = self.config.batch.micro_batch_size * self.topology.data_parallel_size
            self.setup.engine.set_train_batch_size(num_micro * micro)
            self._num_micro = num_micro

    def _stop_if_diverged(self, consecutive_nan: int) -> None:
        if consecutive_nan >= self.config.exit.max_nan_iterations:
            raise TrainingDiverged(
                f"the loss was NaN or inf for {consecutive_nan} iterations in a row (up to "
                f"iteration {self.state.iteration}); stopping without saving, the last good "
                "checkpoint is untouched; lower --lr or raise --clip-grad and --load it"
            )

    def _train_step(self, batches) -> StepResult:
        engine = self.setup.engine
        if self.setup.is_pipeline:
            loss = engine.train_batch(data_iter=batches).float().reshape(())
        else:
            total = torch.zeros((), device=self.device)
            for micro in range(self._num_micro):
                # The iteration's last micro-batch is the accumulation boundary (reduce, step),
                # said explicitly as upstream's forward_backward_no_pipelining does: DeepSpeed's
                # own count, (micro_steps + 1) % gradient_accumulation_steps, drifts off the
                # iterations once the ramp-up changes the accumulation steps mid-run.
                engine.set_gradient_accumulation_boundary(micro == self._num_micro - 1)
                tokens, labels, loss_mask = next(batches)
                loss = engine(tokens, labels, loss_mask)
                engine.backward(loss)
                total += loss.detach().float()
            loss = total / self._num_micro
            # Averaged before the step: after it, ZeRO-1/2 gather the weights on this
            # communicator during the next forward, and this all-reduce would wait for that.
            if self.setup.groups.dp_size > 1:
                dist.all_reduce(loss, group=self.setup.groups.dp_group)
                loss /= self.setup.groups.dp_size
            engine.step()
        return StepResult(
            loss=loss.detach(),
            applied=engine.was_step_applied(),
            grad_norm=engine.get_global_grad_norm(),
            loss_scale=_loss_scale(engine),
        )

    # --- reporting --------------------------------------------------------------------------
    def _log_interval(self, stats: IntervalStats, last: StepResult, global_batch: int) -> int:
        """Prints and records the interval; returns its NaN-loss iteration count."""
        mean_loss, num_nan = stats.summary()  # waits for the device: the time below is real
        grad_norm = _as_float(last.grad_norm)
        elapsed = time.perf_counter() - stats.started
        ms = 1000.0 * elapsed / max(1, stats.num_iterations)
        model = self.setup.gpt_config
        flops = megatron_flops_per_iteration(model, global_batch=global_batch)
        tflops = flops / (ms / 1000.0 * self.topology.world_size * 1e12)
        peak = self.config.logging.peak_tflops
        mfu = tflops / peak if peak else None
        remaining = (self.train_iters - self.state.iteration) * ms / 1000.0
        lr = self.setup.optimizer.param_groups[0]["lr"]
        state = self.state
        optimizer_stats = None
        if self.config.logging.log_optimizer_states_to_tensorboard:  # a collective: every rank
            optimizer_stats = optimizer_state_stats(
                self.setup.optimizer,
                self.setup.groups,
                sharded=self.setup.ds_config["zero_optimization"]["stage"] > 0,
                device=self.device,
            )
        if self.rank == 0:
            logger.info(
                interval_line(
                    iteration=state.iteration,
                    train_iters=self.train_iters,
                    consumed_samples=state.consumed_train_samples,
                    consumed_tokens=state.consumed_train_tokens,
                    ms_per_iteration=ms,
                    learning_rate=lr,
                    global_batch=global_batch,
                    mean_loss=mean_loss,
                    num_skipped=stats.num_skipped,
                    num_nan=num_nan,
                    loss_scale=last.loss_scale,
                    grad_norm=grad_norm,
                    seq_length=model.seq_length,
                    tflops=tflops,
                    mfu=mfu,
                    eta_seconds=remaining,
                )
            )
            self.metrics.record(
                {
                    "event": "train",
                    "iteration": state.iteration,
                    "consumed_samples": state.consumed_train_samples,
                    "consumed_tokens": state.consumed_train_tokens,
                    "lm_loss": mean_loss,
                    "learning_rate": lr,
                    "global_batch_size": global_batch,
                    "loss_scale": last.loss_scale,
                    "grad_norm": grad_norm,
                    "skipped_iterations": stats.num_skipped,
                    "nan_iterations": num_nan,
                    "ms_per_iteration": ms,
                    "tokens_per_second": global_batch * model.seq_length / (ms / 1000.0),
                    "tflops_per_gpu": tflops,
                    "mfu": mfu,
                    "max_memory_allocated_gib": _peak_memory_gib(torch.cuda.max_memory_allocated),
                    # The caching allocator's peak: CUDA graphs replay inside memory they hold
                    # reserved, which the allocated figure does not count.
                    "max_memory_reserved_gib": _peak_memory_gib(torch.cuda.max_memory_reserved),
                }
            )
            self._tensorboard_training(mean_loss, lr, global_batch, grad_norm, last, ms, tflops)
            if optimizer_stats is not None:  # upstream's axes: iterations and tokens
                self.metrics.scalars(optimizer_stats, step=state.iteration)
                self.metrics.scalars(
                    {tag + " vs tokens": value for tag, value in optimizer_stats.items()},
                    step=state.consumed_train_tokens,
                )
        return num_nan

    def _tensorboard_training(self, loss, lr, global_batch, grad_norm, last, ms, tflops) -> None:
        state, options = self.state, self.config.logging
        steps = {
            "iteration": state.iteration,
            "samples": state.consumed_train_samples,
            "tokens": state.consumed_train_tokens,
        }
        scalars = {
            "learning-rate/learning-rate": lr,
            "lm-loss-training/lm loss": loss,
            "grad-norm/grad-norm": grad_norm,
            "loss-scale/loss-scale": last.loss_scale,
        }
        if options.log_batch_size_to_tensorboard:
            scalars["batch-size/batch-size"] = global_batch
        for axis, step in steps.items():
            suffix = "" if axis == "iteration" else f" vs {axis}"
            self.metrics.scalars({tag + suffix: v for tag, v in scalars.items()}, step=step)
        if options.log_timers_to_tensorboard:
            seconds = ms / 1000.0
            self.metrics.scalars(
                {
                    "iteration-time/iteration-time": seconds,
                    "iteration-time/samples per second": global_batch / seconds,
                    "iteration-time/tokens per second": global_batch
                    * self.config.model.seq_length
                    / seconds,
                    "iteration-time/TFLOPs per gpu (estimated)": tflops,
                },
                step=state.iteration,
            )

    def _evaluate(self, batches, prefix: str, name: str) -> float:
        """Mean loss over --eval-iters global batches of the continuing iterator."""
        engine, eval_iters = self.setup.engine, self.config.logging.eval_iters
        engine.eval()
        total = torch.zeros((), device=self.device)
        with torch.no_grad():
            for _ in range(eval_iters):
                if self.setup.is_pipeline:
                    loss = engine.eval_batch(
                        data_iter=pipeline_batches(batches), num_micro_batches=self._num_micro
                    )
                    total += loss.float().reshape(())
                else:
                    step = torch.zeros((), device=self.device)
                    for _ in range(self._num_micro):
                        step += engine(*next(batches)).float()
                    total += step / self._num_micro
        engine.train()
        loss = total / eval_iters
        if not self.setup.is_pipeline and self.setup.groups.dp_size > 1:
            dist.all_reduce(loss, group=self.setup.groups.dp_group)
            loss /= self.setup.groups.dp_size
        value = loss.item()
        if name == "validation":
            global_batch = self._num_micro * self.config.batch.micro_batch_size
            self.state.consumed_valid_samples += (
                eval_iters * global_batch * self.topology.data_parallel_size
            )
        if self.rank == 0:
            for line in validation_lines(prefix, value):
                logger.info(line)
            self.metrics.record(
                {"event": name, "iteration": self.state.iteration, "lm_loss": value, "at": prefix}
            )
            tag = f"lm-loss-validation/lm loss {name}"
            scalars = {tag: value}
            if self.config.logging.log_validation_ppl_to_tensorboard:
                scalars[tag + " ppl"] = perplexity(value)
            self.metrics.scalars(scalars, step=self.state.iteration)
        return value

    # --- checkpoints and exits --------------------------------------------------------------
    def _save(self, last: StepResult) -> bool:
        save_dir = self.config.checkpoint.save
        if save_dir is None:
            return False
        if not math.isfinite(float(last.loss)):
            logger.warning(
                "not saving at iteration %d: the loss is NaN or inf, the last checkpoint stays",
                self.state.iteration,
            )
            return False
        save_checkpoint(self.checkpoint, self.state, Path(save_dir))
        return True

    def _kill_switch_present(self) -> bool:
        path = self.config.exit.kill_switch_path
        return path is not None and Path(path).exists()

    def _exit(self, request: ExitRequest, *, saved: bool) -> int:
        """Says why the run stops and whether a checkpoint holds its progress; returns the exit
        code. A signal that stopped a run with nothing saved (no --save; a NaN loss, never saved)
        gives 128 + its number, the code of a process the signal ended (143 for SIGTERM), so a
        job script sees that the work since the last checkpoint is lost; with a checkpoint saved
        it is 0, as upstream's."""
        if saved:
            outcome = "checkpoint saved"
        elif self.config.checkpoint.save is None:
            outcome = "no checkpoint saved (no --save)"
        else:
            outcome = "no checkpoint saved (the loss is NaN or inf; the last checkpoint stays)"
        logger.info(
            "%s, %s: exiting at iteration %d", request.reason, outcome, self.state.iteration
        )
        return 128 + request.signum if request.signum and not saved else 0

    def _exit_reason(self) -> ExitRequest | None:
        """Why to stop now, if so; every rank reaches the same answer. The exit interval is the
        same everywhere; signals, the kill switch and the time limit are local, so ranks agree on
        them every iteration through one all-reduce of three integers on `exit_group`. A signal
        that arrives during iteration N is acted on after N, or after N + 1 when it came after
        this rank's check of N."""
        options, iteration = self.config.exit, self.state.iteration
        minutes = (time.time() - self.started) / 60.0
        # Upstream's `if args.exit_duration_in_mins:`: 0, like no flag, is no limit.
        limit = options.exit_duration_in_mins
        local = [
            self._signal,
            int(self._kill_switch_present()),
            int(bool(limit) and minutes > limit),
        ]
        if self.exit_group is not None:
            flags = torch.tensor(local, dtype=torch.int64)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.exit_group)
            local = flags.tolist()
        received, kill_switch, over_time = local
        if received:
            return ExitRequest(f"received {signal.Signals(received).name}", signum=received)
        if kill_switch:
            return ExitRequest(
                f"Detected kill switch at {options.kill_switch_path}, iteration={iteration}"
            )
        if over_time:
            return ExitRequest(f"exceeded --exit-duration-in-mins {options.exit_duration_in_mins}")
        if options.exit_interval and iteration % options.exit_interval == 0:
            return ExitRequest(f"--exit-interval {options.exit_interval} reached")
        return None


def _peak_memory_gib(peak: Callable[[], int]) -> float | None:
    if not torch.cuda.is_available():
        return None
    return peak() / 2**30


def _as_float(value) -> float | None:
    if value is None:
        return None
    return float(value.item() if torch.is_tensor(value) else value)


def _loss_scale(engine) -> float | None:
    if not engine.fp16_enabled():
        return None
    return current_loss_scale(engine)
