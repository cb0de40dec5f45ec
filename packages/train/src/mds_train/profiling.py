"""Upstream Megatron-DeepSpeed's torch.profiler hooks (megatron/profiler.py, its flags from
arguments.py's `_add_profiler_args`): iterations START..END of this process (counted from 1, as
upstream's `cur_step`) recorded on the chosen ranks, CPU plus CUDA activity, and written by
`tensorboard_trace_handler` into --tensorboard-dir (gzipped, one trace per rank);
`benchmarks/host_profile.py` summarises a trace.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from mds_common.flags import flag


def parse_profile_steps(text: str) -> tuple[int, int]:
    """'START,END' -> (START, END), 1 <= START <= END, as upstream's `map(int, split(','))`."""
    try:
        start, end = (int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(
            f"--profile_steps {text!r}: expected START,END with integers, e.g. --profile_steps 2,3"
        ) from None
    if not 1 <= start <= end:
        raise ValueError(
            f"--profile_steps {text!r}: steps count from 1 and START must not exceed END, "
            "e.g. --profile_steps 2,3"
        )
    return start, end


@dataclass(frozen=True, kw_only=True)
class ProfilerFlags:
    profile: str | None = flag(
        "--profile",
        choices=("pt", "pt-full"),
        help="torch.profiler trace of --profile_steps into --tensorboard-dir; pt-full adds "
        "Python call stacks.",
    )
    # A string as upstream's (`args.profile_steps`), checked here so a typo fails at once.
    profile_steps: str = flag(
        "--profile_steps",
        default="2,3",
        help="Iterations of this process to profile, START,END (counted from 1).",
    )
    profile_ranks: tuple[int, ...] | None = flag(
        "--profile-ranks",
        multiple=True,
        help="Ranks to profile: --profile-ranks 0 1.",
        shown_default="every rank",
    )

    def __post_init__(self) -> None:
        parse_profile_steps(self.profile_steps)

    @property
    def steps(self) -> tuple[int, int]:
        return parse_profile_steps(self.profile_steps)

    def check(self, *, tensorboard_dir: Path | None) -> None:
        """Upstream's trace handler writes into --tensorboard-dir, which has no default there."""
        if self.profile is not None and tensorboard_dir is None:
            raise ValueError(
                f"--profile {self.profile} writes its trace into --tensorboard-dir; give "
                "--tensorboard-dir"
            )


class StepProfiler:
    """upstream's `setup_profiler` as an object: `step_begin()` and `step_end()` around every
    iteration, `close()` when training ends (it writes what was recorded if the run stopped
    before END, where upstream would write nothing). Off: every call does nothing."""

    def __init__(
        self, flags: ProfilerFlags, *, rank: int, tensorboard_dir: Path | None, cuda: bool
    ) -> None:
        self._step = 0
        self._start, self._end = flags.steps
        self._profiler = None
        self._running = False
        ranks = flags.profile_ranks
        if flags.profile is None or (ranks is not None and rank not in ranks):
            return
        import torch.profiler as tp

        activities = [tp.ProfilerActivity.CPU]
        if cuda:
            activities.append(tp.ProfilerActivity.CUDA)
        with warnings.catch_warnings():  # upstream's schedule has no warmup, knowingly
            warnings.filterwarnings("ignore", message=".*won't be using warmup")
            schedule = tp.schedule(wait=0, warmup=0, active=self._end - self._start + 1, repeat=1)
        self._profiler = tp.profile(
            schedule=schedule,
            activities=activities,
            on_trace_ready=tp.tensorboard_trace_handler(str(tensorboard_dir), use_gzip=True),
            with_stack=flags.profile == "pt-full",
        )

    @classmethod
    def off(cls) -> StepProfiler:
        return cls(ProfilerFlags(), rank=0, tensorboard_dir=None, cuda=False)

    def step_begin(self) -> None:
        self._step += 1
        if self._profiler is not None and self._step == self._start:
            self._profiler.start()
            self._running = True

    def step_end(self) -> None:
        if not self._running:
            return
        self._profiler.step()  # closes this step's ProfilerStep#N span
        if self._step == self._end:
            self._profiler.stop()
            self._running = False

    def close(self) -> None:
        if self._running:
            self._profiler.stop()
            self._running = False
