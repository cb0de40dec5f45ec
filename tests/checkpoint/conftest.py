"""Fixtures of the mds-merge-mp tests: real mds-train checkpoints, trained once per session.

The runs reuse tests/train/runs.py (tiny GPT on Megatron's golden dataset, deepspeed launcher over
gloo). Every run here has 4 layers (PP=2 and PP=4 split them) and 4 heads (TP=4 divides them).
- `tp2_run`: fp32, TP=2 in 2 processes, 8 iterations, checkpoints at 4 and 8: the uninterrupted
  reference of the resume tests and a plain-engine source with torch's AdamW state;
- `resumed_pp2` / `resumed_dp2` / `resumed_zero3`: its iteration-4 checkpoint reshaped with
  optimizer state to PP=2 (pipeline engine) and to TP=1 run at DP=2 with ZeRO-1 and with ZeRO-3,
  resumed to iteration 8 and saved;
- `zero3_run`: fp32, ZeRO-3 over 2 DP ranks, 6 iterations, checkpoints at 3 and 6 (weights only
  in fp32 partitions), and `zero3_resumed_tp2`: its iteration-3 checkpoint reshaped to TP=2 and
  resumed at TP=2 with ZeRO-3;
- `tp2pp2_checkpoint`: bf16, TP=2 x PP=2 in 4 processes, 2 iterations: pipeline layer files and
  DeepSpeed's BF16 optimizer partitions.
"""

import enum
import sys
import types
from pathlib import Path

import pytest

MODEL = (
    "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8"
).split()


@pytest.fixture(scope="session")
def merge_mp(runs):
    """merge_mp(*args): mds-merge-mp's command line, run in this process -> CompletedProcess
    (code, stdout, stderr)."""
    from mds_checkpoint.cli import main

    return lambda *args: runs.in_process(main, *args)


@pytest.fixture(scope="session")
def train_flags(runs, shared_data, data_cache):
    """flags(out, *extra, iterations=N): a tiny run without dropout, a loss line each."""

    def flags(out: Path, *extra: str, iterations: int = 8) -> list[str]:
        return [
            *MODEL,
            *runs.OPTIMIZER,
            *runs.NO_DROPOUT,
            *runs.data_flags(shared_data, data_cache),
            *f"--train-iters {iterations} --lr-decay-iters 20 --log-interval 1".split(),
            *"--eval-interval 1000 --eval-iters 1 --output-dir".split(),
            str(out),
            *extra,
        ]

    return flags


def _train(runs, flags, nproc):
    result = runs.train(flags, nproc=nproc)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="session")
def tp2_run(runs, train_flags, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tp2")
    extra = ["--tensor-model-parallel-size", "2", "--save", str(out / "checkpoints")]
    _train(runs, train_flags(out, *extra, "--save-interval", "4"), 2)
    return out


def _resume(
    runs, train_flags, source: Path, out: Path, target: list[str], run: list[str], *,
    iteration: int = 4, iterations: int = 8,
) -> Path:  # fmt: skip
    from mds_checkpoint.cli import main

    reshaped = out / "reshaped"
    result = runs.in_process(
        main,
        "--load", source / "checkpoints", "--iteration", iteration, "--save", reshaped,
        "--with-optimizer", *target,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    flags = [*run, "--load", str(reshaped), "--save", str(out / "ckpt")]
    _train(runs, train_flags(out, *flags, iterations=iterations), 2)
    return out


@pytest.fixture(scope="session")
def resumed_pp2(runs, train_flags, tp2_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resumed-pp2")
    target = ["--target-pipeline-model-parallel-size", "2"]
    return _resume(runs, train_flags, tp2_run, out, target, ["--pipeline-model-parallel-size", "2"])


@pytest.fixture(scope="session")
def resumed_dp2(runs, train_flags, tp2_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resumed-dp2")
    return _resume(runs, train_flags, tp2_run, out, [], ["--zero-stage", "1"])


@pytest.fixture(scope="session")
def resumed_zero3(runs, train_flags, tp2_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resumed-zero3")
    return _resume(runs, train_flags, tp2_run, out, [], ["--zero-stage", "3"])


@pytest.fixture(scope="session")
def tp2pp2_checkpoint(runs, train_flags, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tp2pp2")
    save = out / "checkpoints"
    parallel = "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --bf16".split()
    _train(runs, train_flags(out, *parallel, "--save", str(save), iterations=2), 4)
    return save


@pytest.fixture(scope="session")
def zero3_run(runs, train_flags, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zero3")
    extra = ["--zero-stage", "3", "--save", str(out / "checkpoints"), "--save-interval", "3"]
    _train(runs, train_flags(out, *extra, iterations=6), 2)
    return out


@pytest.fixture(scope="session")
def zero3_checkpoint(zero3_run) -> Path:
    """fp32, ZeRO-3 over 2 data-parallel ranks: weights only in fp32 partitions."""
    return zero3_run / "checkpoints"


@pytest.fixture(scope="session")
def zero3_resumed_tp2(runs, train_flags, zero3_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zero3-resumed-tp2")
    target = ["--target-tensor-model-parallel-size", "2"]
    run = ["--tensor-model-parallel-size", "2", "--zero-stage", "3"]
    return _resume(runs, train_flags, zero3_run, out, target, run, iteration=3, iterations=6)


@pytest.fixture(scope="module")
def megatron_enums():
    """Upstream's `args` pickle one Megatron class, `megatron.core.enums.ModelType` (its values as
    in Megatron-DeepSpeed's megatron/core/enums.py); torch needs it importable to load and save
    the goldens' states in a test (`pytestmark = pytest.mark.usefixtures("megatron_enums")`).
    mds's own reader never imports it."""
    enums = types.ModuleType("megatron.core.enums")
    enums.ModelType = enum.Enum(
        "ModelType", "encoder_or_decoder encoder_and_decoder retro_encoder retro_decoder"
    )
    enums.ModelType.__module__ = enums.__name__
    modules = {"megatron": types.ModuleType("megatron"), "megatron.core": types.ModuleType("x")}
    modules["megatron.core.enums"] = enums
    assert not set(modules) & set(sys.modules)
    sys.modules.update(modules)
    yield
    for name in modules:
        del sys.modules[name]
