"""Joining the job: ranks from the deepspeed launcher, torchrun, SLURM's srun, or one plain process.

Every launcher ends as the same environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)
before `deepspeed.init_distributed`; the backend is NCCL on GPUs and gloo on CPU unless named
(fallbacks.choose_backend).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass
from datetime import timedelta

import torch

from .deepspeed_engine import default_process_group_timeout


@dataclass(frozen=True)
class LaunchInfo:
    rank: int
    world_size: int
    local_rank: int
    launcher: str


def launch_environment(environ: dict[str, str] | None = None) -> LaunchInfo:
    """Fills RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* in `environ` (os.environ by default)."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "deepspeed/torchrun"
    elif "SLURM_PROCID" in env:
        launcher = "srun"
        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env.get("SLURM_NTASKS", "1")
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        env.setdefault("MASTER_ADDR", _first_slurm_host(env.get("SLURM_JOB_NODELIST", "")))
        env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 40000))
    else:
        launcher = "single process"
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(_free_port()))
    env.setdefault("LOCAL_RANK", "0")
    return LaunchInfo(
        rank=int(env["RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        local_rank=int(env["LOCAL_RANK"]),
        launcher=launcher,
    )


def _first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list (`gpu[003-004,007],cpu01` -> `gpu003`)."""
    try:
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
        ).stdout.split()
        if hosts:
            return hosts[0]
    except (OSError, subprocess.CalledProcessError):
        pass
    match = re.match(r"([^,\[]+)(?:\[([^\],-]+))?", nodelist)
    if not match:
        return "127.0.0.1"
    return match.group(1) + (match.group(2) or "")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(backend: str, *, timeout_minutes: int | None = None) -> LaunchInfo:
    """Joins the process group (backend: fallbacks.choose_backend's); on GPUs each process takes
    the device of its local rank. Collectives fail after `timeout_minutes` (Megatron's
    --distributed-timeout-minutes) waiting for a rank; when None, DeepSpeed's default (10,
    as Megatron's, or the DEEPSPEED_TIMEOUT environment variable)."""
    import deepspeed

    info = launch_environment()  # idempotent: a second call reads what the first filled in
    if torch.cuda.is_available():
        torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
    for attempt in range(5):
        try:
            deepspeed.init_distributed(
                dist_backend=backend,
                verbose=False,
                timeout=default_process_group_timeout()
                if timeout_minutes is None
                else timedelta(minutes=timeout_minutes),
            )
            return info
        except torch.distributed.DistNetworkError:
            # A single process picks its own port; another program may take it between the
            # pick and the bind. Launchers' ports are theirs to choose: no retry there.
            if info.launcher != "single process" or attempt == 4:
                raise
            os.environ["MASTER_PORT"] = str(_free_port())
    return info


# How a collective or the rendezvous store says that another process of the job is gone: gloo's
# "Connection closed by peer" / "reset by peer" (a write: "Broken pipe"), NCCL's "remote process
# exited", and the store's DistNetworkError (it lives in rank 0's process).
_PEER_GONE = ("closed by peer", "reset by peer", "Broken pipe", "remote process exited")


def another_process_left(error: BaseException) -> bool:
    """Whether `error` (or what it was raised from) is a collective failing because another
    process of the job exited or was killed."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, torch.distributed.DistNetworkError):
            return True
        if isinstance(seen, RuntimeError) and any(words in str(seen) for words in _PEER_GONE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
