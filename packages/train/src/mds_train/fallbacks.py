"""What a GPU recipe becomes where there is no GPU: each change is one warning line of rank 0.

Every training line of the seeds carries `--distributed-backend nccl` and most `--fp16`. Without a
GPU, nccl becomes gloo (NCCL is a GPU library; torch's CPU builds lack it), and fp16 becomes fp32
where DeepSpeed's accelerator has no fp16 (its CPU accelerator has it only with AVX512-FP16). A
backend missing for any other reason is one error line naming the flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .config import TrainConfig


def choose_backend(
    requested: str | None, *, cuda: bool, available: Callable[[str], bool]
) -> tuple[str, str | None]:
    """(the backend to join with, a note or None); `available(name)` says torch has it."""
    backend = requested or ("nccl" if cuda else "gloo")
    note = None
    if backend == "nccl" and not cuda:
        backend = "gloo"
        note = "--distributed-backend nccl: no GPU here; using gloo"
    if not available(backend):
        named = f"--distributed-backend {requested}" if requested else "--distributed-backend"
        other = "gloo" if backend == "nccl" else "nccl"
        raise ValueError(
            f"{named}: this torch build has no {backend} support; "
            f"pass --distributed-backend {other} or install a torch with {backend}"
        )
    return backend, note


def without_fp16(
    config: TrainConfig, user: dict[str, Any], *, fp16_supported: bool
) -> tuple[TrainConfig, dict[str, Any], str | None]:
    """fp16 becomes fp32 where the device has no fp16: the config, the user's DeepSpeed file
    (its fp16 section dropped, already folded into the config) and a note."""
    if not config.precision.fp16 or fp16_supported:
        return config, user, None
    precision = dataclasses.replace(config.precision, fp16=False)
    config = dataclasses.replace(config, precision=precision)
    user = {key: value for key, value in user.items() if key != "fp16"}
    note = "fp16: no GPU here and DeepSpeed has no fp16 on this CPU; training in fp32"
    return config, user, note
