"""Fixtures of the mds-train tests: the launch helpers (runs.py) and one shared reference run."""

import importlib.util
from pathlib import Path

import pytest


def _load_runs():
    path = Path(__file__).with_name("runs.py")
    spec = importlib.util.spec_from_file_location("train_runs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def runs():
    return _load_runs()


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("index-cache")


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
