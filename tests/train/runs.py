"""Launching mds-train for the tests: one plain process, or N under the deepspeed launcher (gloo).

The tiny model trains on Megatron's golden dataset (tiny GPT-2 vocabulary, 5000 tokens); every
run writes metrics.jsonl, whose per-iteration losses the tests compare.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

GOLDEN = "megatron-golden/meg-gpt2-openwebtext_text_document"
SEED = 1234
# 2 layers (PP=2 gets one each), 4 heads (TP=2 gets two), 8 samples per iteration.
MODEL = (
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
    "--micro-batch-size 2 --global-batch-size 8"
).split()
OPTIMIZER = (
    "--lr 5e-3 --min-lr 5e-4 --lr-decay-style cosine --lr-warmup-iters 3 --weight-decay 0.1 "
    "--clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --seed 1234"
).split()
NO_DROPOUT = "--hidden-dropout 0 --attention-dropout 0".split()


def in_process(main, *args) -> subprocess.CompletedProcess:
    """A tool's `main(argv)` in this process (a subprocess would import torch again each time;
    tests/common/test_dialect.py runs the installed commands): its exit code, stdout, stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main([str(arg) for arg in args])
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
    return subprocess.CompletedProcess(args, code, stdout.getvalue(), stderr.getvalue())


def data_flags(shared_data: Path, cache: Path) -> list[str]:
    return [
        "--data-path",
        str(shared_data / GOLDEN),
        "--vocab-file",
        str(shared_data / "megatron-golden/gpt2-tiny-vocab.json"),
        "--merge-file",
        str(shared_data / "megatron-golden/gpt2-tiny-merges.txt"),
        "--data-cache-path",
        str(cache),
        "--split",
        "949,50,1",
    ]


def checkpoint_test_flags(shared_data: Path, cache: Path, out: Path, *extra) -> list[str]:
    """The tiny model without dropout, a loss line every iteration, no evaluation, its metrics
    in `out`, then `extra`: the runs the checkpoint tests save, damage and resume."""
    flags = [
        *MODEL, *OPTIMIZER, *NO_DROPOUT, *data_flags(shared_data, cache),
        *"--lr-decay-iters 20 --log-interval 1 --eval-iters 0 --output-dir".split(), out, *extra,
    ]  # fmt: skip
    return [str(flag) for flag in flags]


def universal_of(checkpoint: Path, out: Path) -> Path:
    """`mds-merge-mp --with-optimizer` of `checkpoint` (a save folder or one global_stepN folder)
    into `out`, in this process: the universal checkpoint the resume tests load."""
    from mds_checkpoint.cli import main as merge_mp

    with pytest.raises(SystemExit) as exit_:
        merge_mp(["--load", str(checkpoint), "--save", str(out), "--with-optimizer"])
    assert exit_.value.code == 0
    return out


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # CPU training takes the pure-torch paths
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def command(flags: list[str], *, nproc: int = 1) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "mds_train", *flags]
    if os.environ.get("MDS_TEST_MULTIPROCESS") == "0":
        raise AssertionError(f"a {nproc}-process run from a test not marked multiprocess")
    launcher = shutil.which("deepspeed") or str(Path(sys.executable).with_name("deepspeed"))
    return [
        launcher,
        "--num_gpus",
        str(nproc),
        "--master_port",
        str(_free_port()),
        "--module",
        "mds_train",
        *flags,
    ]


def train(flags: list[str], *, nproc: int = 1, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(flags, nproc=nproc),
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ds_to_universal(checkpoint: Path, output: Path) -> None:
    """DeepSpeed's own ds_to_universal of one checkpoint folder into `output`."""
    result = subprocess.run(
        [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
         "--input_folder", str(checkpoint), "--output_folder", str(output)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def start(flags: list[str], log: Path, *, nproc: int = 1) -> subprocess.Popen:
    handle = open(log, "w")  # noqa: SIM115 - closed with the process by the caller's wait
    return subprocess.Popen(
        command(flags, nproc=nproc),
        env=_environment(),
        stdout=handle,
        stderr=subprocess.STDOUT,
        text=True,
    )


def rank_processes(launcher: subprocess.Popen, nproc: int, timeout: float = 60) -> list:
    """The training processes the deepspeed launcher started (psutil.Process objects)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = psutil.Process(launcher.pid).children(recursive=True)
        ranks = [p for p in children if any("--local_rank" in a for a in _cmdline(p))]
        if len(ranks) == nproc:
            return ranks
        time.sleep(0.05)
    raise AssertionError(f"the launcher did not start {nproc} ranks in {timeout} s")


def _cmdline(process) -> list[str]:
    import psutil

    try:
        return process.cmdline()
    except psutil.Error:  # gone, or a zombie
        return []


def train_records(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["event"] == "train"]


def losses(output_dir: Path) -> dict[int, float]:
    return {r["iteration"]: r["lm_loss"] for r in train_records(output_dir)}


# A parallel layout trains on the same samples as one process but sums losses and gradients in
# another order (per rank, then across ranks): fp32 reduction noise, a few ulps (u = 6e-8) per
# sum, grown by each optimizer step. Seen over 8 iterations: 1.1e-7 relative for TP2 x PP2 x DP2,
# 6e-8 for DP=2 over two nodes. 2e-5 (~300 u) is the baseline's margin (test_equivalence's
# BASELINE_RTOL), room for other CPUs' kernels yet far below what a wrong sample, shard or
# schedule moves a loss by.
LAYOUT_RTOL = 2e-5


def assert_losses_match(output_dir: Path, reference_dir: Path, iterations: int) -> None:
    """Iterations 1..`iterations` of a parallel run equal a one-process run's, and it learns."""
    ours, reference = losses(output_dir), losses(reference_dir)
    assert sorted(ours) == list(range(1, iterations + 1))
    for iteration in ours:
        assert ours[iteration] == pytest.approx(reference[iteration], rel=LAYOUT_RTOL), iteration
    assert ours[iterations] < ours[1]


def wait_for_iteration(output_dir: Path, iteration: int, process, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if losses(output_dir) and max(losses(output_dir)) >= iteration:
            return
        if process.poll() is not None:
            raise AssertionError(f"training ended (exit {process.returncode}) before {iteration}")
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    raise AssertionError(f"iteration {iteration} not reached in {timeout} s")


# --- the ZeRO tests' runs (test_sharded_zero.py, test_zero3.py): bf16, saved and resumed ---------

# A DeepSpeed file's `optimizer` section: DeepSpeed builds this AdamW itself, so a ZeRO run keeps
# DeepSpeed's own optimizer for its stage (BF16_Optimizer, DeepSpeedZeroOptimizer, stage 3) around
# it, the other side of the files mds-train's own ZeRO optimizers write and read.
DEEPSPEED_ADAMW = {
    "optimizer": {
        "type": "AdamW",
        "params": {"torch_adam": True, "betas": [0.9, 0.95], "eps": 1e-8},
    }
}


def deepspeed_adamw_file(directory: Path) -> Path:
    """DEEPSPEED_ADAMW written as a DeepSpeed file in `directory`."""
    path = directory / "deepspeed_optimizer.json"
    path.write_text(json.dumps(DEEPSPEED_ADAMW))
    return path


def bf16_flags(shared_data: Path, cache: Path, out: Path, iterations: int, *extra) -> list[str]:
    """checkpoint_test_flags' run in bf16 for `iterations`, then `extra`."""
    run = ("--train-iters", iterations, "--bf16", "--eval-interval", 1000)
    return checkpoint_test_flags(shared_data, cache, out, *run, *extra)


def train_ok(flags: list[str], *, nproc: int) -> None:
    """A run that must succeed; its stderr's end otherwise."""
    result = train(flags, nproc=nproc)
    assert result.returncode == 0, result.stderr[-3000:]


def checkpoint_at(run: Path, iteration: int, tmp_path: Path) -> Path:
    """A copy of `run`'s checkpoint folder (run/ckpt) holding iteration `iteration` only, with a
    `latest` that names it."""
    copy = tmp_path / "ckpt"
    step = f"global_step{iteration}"
    shutil.copytree(run / "ckpt" / step, copy / step)
    (copy / "latest").write_text(step)
    return copy
