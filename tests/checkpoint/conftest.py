"""Fixtures of the mds-merge-mp tests: real mds-train checkpoints, trained once per session.

The runs reuse tests/train/runs.py (tiny GPT on Megatron's golden dataset, deepspeed launcher over
gloo). Every run here has 4 layers (so PP=2 and PP=4 split them) and 4 heads (TP=4 divides them).
"""

import importlib.util
from pathlib import Path

import pytest

TRAIN_TESTS = Path(__file__).resolve().parent.parent / "train"
MODEL = (
    "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8"
).split()


def _load_runs():
    spec = importlib.util.spec_from_file_location("checkpoint_train_runs", TRAIN_TESTS / "runs.py")
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
def train_flags(runs, shared_data, data_cache):
    """flags(out, *extra, iterations=N): a tiny fp32 run without dropout, a loss line each."""

    def flags(out: Path, *extra: str, iterations: int = 4) -> list[str]:
        return [
            *MODEL,
            *runs.OPTIMIZER,
            *runs.NO_DROPOUT,
            *runs.data_flags(shared_data, data_cache),
            *f"--train-iters {iterations} --lr-decay-iters 20 --log-interval 1".split(),
            *"--eval-interval 1000".split(),
            *"--eval-iters 1 --output-dir".split(),
            str(out),
            *extra,
        ]

    return flags


@pytest.fixture(scope="session")
def tp2pp2_checkpoint(runs, train_flags, tmp_path_factory) -> Path:
    """TP=2 x PP=2 in 4 processes, 2 iterations: the pipeline engine's layer files."""
    out = tmp_path_factory.mktemp("tp2pp2")
    save = out / "checkpoints"
    flags = train_flags(
        out,
        *"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2".split(),
        "--save",
        str(save),
        iterations=2,
    )
    result = runs.train(flags, nproc=4)
    assert result.returncode == 0, result.stderr[-3000:]
    return save
