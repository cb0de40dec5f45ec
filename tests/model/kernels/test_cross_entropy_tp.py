"""vocab_parallel_cross_entropy over a real TP=2 group (2 gloo processes on CPU) equals
F.cross_entropy."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).with_name("tp_cross_entropy_worker.py")


def test_tp2_matches_full_cross_entropy(tmp_path):
    env = dict(os.environ)
    init_file = tmp_path / "rendezvous"
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", str(init_file)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outputs.append((proc.returncode, out, err))
    for rank, (code, out, err) in enumerate(outputs):
        assert code == 0, f"rank {rank} failed:\n{out}\n{err}"
        assert out.strip().endswith("ok")
