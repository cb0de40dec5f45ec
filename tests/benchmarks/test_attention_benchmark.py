"""benchmarks/attention.py runs on a CUDA GPU only (the device machine): without one it says so in
one line, and an unknown shape is a usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/attention.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_without_a_gpu_it_is_one_line():
    result = run("--shapes", "345m")
    assert result.returncode == 1
    assert (
        result.stderr
        == "attention.py: error: this benchmark needs a CUDA GPU; there is none here\n"
    )


def test_an_unknown_shape_is_a_usage_error():
    result = run("--shapes", "345m,7b")
    assert result.returncode == 2
    assert "--shapes: unknown 7b; choose from 345m, 1.3b" in result.stderr.splitlines()[-1]
