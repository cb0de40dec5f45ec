"""Fixtures of the mds-train tests: one shared reference run (the launch helpers, runs.py, are
the `runs` fixture of tests/conftest.py)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def reference_run(runs, shared_data, data_cache, tmp_path_factory) -> Path:
    """fp32, one process, no dropout, 20 iterations, a loss line each: the run the plain PyTorch
    loop, the checked-in baseline and the parallel layouts are compared with."""
    out = tmp_path_factory.mktemp("reference")
    flags = [
        *runs.MODEL,
        *runs.OPTIMIZER,
        *runs.NO_DROPOUT,
        *runs.data_flags(shared_data, data_cache),
        *"--train-iters 20 --log-interval 1 --eval-interval 10 --eval-iters 1".split(),
        "--output-dir",
        str(out),
    ]
    result = runs.train(flags)
    assert result.returncode == 0, result.stderr[-3000:]
    return out
