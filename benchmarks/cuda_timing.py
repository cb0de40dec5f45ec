"""The timing loop benchmarks/attention.py and benchmarks/model_step.py share: a CUDA step's mean
milliseconds per call after warm-up calls, timed between device synchronisations (so the queued
kernels are in it, not just their launches). Scripts in benchmarks/ import it by name: Python puts
a script's own folder first on its path."""

from __future__ import annotations

import time
from collections.abc import Callable

WARMUP_CALLS = 3


def timed_ms(step: Callable[[], object], repeats: int) -> float:
    import torch

    for _ in range(WARMUP_CALLS):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3
