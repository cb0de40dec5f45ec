"""Launches measured by hand before (issue #25), kept under test: TP=2 x PP=2 x DP=2 (8 gloo
processes, ZeRO-1) under the deepspeed launcher, and two nodes on one machine, started by torchrun
(`--nnodes 2 --node_rank 0|1`) or as srun starts them (SLURM's variables, no launcher). Each run's
losses equal the one-process reference run's (tests/train/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The reference's 20-iteration schedule, left at --exit-interval: every run here sees its first
# iterations' samples and learning rates.
REFERENCE_ITERS = "--train-iters 20 --log-interval 1 --eval-interval 10 --eval-iters 1".split()


def flags(runs, shared_data: Path, data_cache: Path, out: Path, iterations: int) -> list[str]:
    return [
        *runs.MODEL,
        *runs.OPTIMIZER,
        *runs.NO_DROPOUT,
        *runs.data_flags(shared_data, data_cache),
        *REFERENCE_ITERS,
        *["--exit-interval", str(iterations), "--output-dir", str(out)],
    ]


@pytest.mark.multiprocess
def test_tp2_pp2_dp2_zero1_matches_one_process(
    runs, reference_run, shared_data, data_cache, tmp_path
):
    """8 ranks: two pipeline stages of one layer each, two heads per tensor-parallel rank, and
    two data-parallel replicas whose optimizer states ZeRO-1 partitions."""
    iterations = 8  # start-up (8 imports of DeepSpeed) takes most of the time, not these
    parallel = "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --zero-stage 1"
    result = runs.train(
        [*flags(runs, shared_data, data_cache, tmp_path, iterations), *parallel.split()], nproc=8
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs.assert_losses_match(tmp_path, reference_run, iterations)


def torchrun_node(node_rank: int, port: int) -> tuple[list[str], dict[str, str]]:
    """One node of two under torchrun's static rendezvous: node 0 hosts its store at `port`."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
    launcher += ["--nproc_per_node", "1", "--node_rank", str(node_rank)]
    launcher += ["--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "mds_train"]
    return launcher, {}


def srun_task(node_rank: int, port: int) -> tuple[list[str], dict[str, str]]:
    """One task per node, as `srun --nodes 2 --ntasks-per-node 1` starts them: no launcher,
    only SLURM's variables, and the rendezvous address the batch script exports."""
    variables = {
        "SLURM_PROCID": str(node_rank),
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node_rank),
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "127.0.0.1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    return [sys.executable, "-m", "mds_train"], variables


def run_nodes(launch, train_flags: list[str], runs, logs: Path, timeout: float = 300) -> None:
    """Starts both nodes at once and waits for both to exit 0. A node still running
    when the test leaves is killed with everything it started."""
    port = runs._free_port()
    nodes = []
    try:
        for node_rank in (0, 1):
            command, variables = launch(node_rank, port)
            log = open(logs / f"node{node_rank}.log", "w")  # noqa: SIM115 - closed below
            process = subprocess.Popen(
                [*command, *train_flags],
                env={**runs._environment(), **variables},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            nodes.append((process, log))
        deadline = time.monotonic() + timeout
        # Until both exit, one fails (the other may wait on it for ever), or time runs out.
        while time.monotonic() < deadline:
            codes = [process.poll() for process, _ in nodes]
            if all(code is not None for code in codes) or any(codes):
                break
            time.sleep(0.1)
    finally:
        for process, log in nodes:
            kill_tree(process)
            log.close()
    outputs = [(logs / f"node{rank}.log").read_text() for rank in (0, 1)]
    codes = [process.returncode for process, _ in nodes]
    assert codes == [0, 0], "\n".join(
        f"node {rank} (exit {code}): {output[-2000:]}"
        for rank, (code, output) in enumerate(zip(codes, outputs, strict=True))
    )


def kill_tree(process: subprocess.Popen) -> None:
    """Kills `process` and its descendants: torchrun starts its worker in a session of its own,
    out of reach of a signal to torchrun's process group."""
    import psutil

    if process.poll() is not None:
        return
    descendants = psutil.Process(process.pid).children(recursive=True)
    process.kill()
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait()
    psutil.wait_procs(descendants, timeout=10)


@pytest.mark.multiprocess
@pytest.mark.parametrize("launch", [torchrun_node, srun_task], ids=["torchrun", "srun"])
def test_two_nodes_train_and_save(launch, runs, reference_run, shared_data, data_cache, tmp_path):
    """DP=2 over two nodes of one rank each (ZeRO-1: each node saves its half of the optimizer
    states) equals one process taking the whole global batch."""
    iterations = 8
    out, save = tmp_path / "out", tmp_path / "ckpt"
    train_flags = [*flags(runs, shared_data, data_cache, out, iterations), "--zero-stage", "1"]
    run_nodes(launch, [*train_flags, "--save", str(save)], runs, tmp_path)
    runs.assert_losses_match(out, reference_run, iterations)
    tag = (save / "latest").read_text().strip()
    assert tag == f"global_step{iterations}"
    meta = json.loads((save / tag / "meta.json").read_text())
    assert meta["iteration"] == iterations and meta["parallel"]["world_size"] == 2
    files = {path.name for path in (save / tag).iterdir()}
    assert {"rng_state_rank00000.pt", "rng_state_rank00001.pt"} <= files, sorted(files)
    assert len([name for name in files if name.endswith("optim_states.pt")]) == 2, sorted(files)
