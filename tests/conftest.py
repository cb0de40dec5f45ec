"""Shared fixtures: where the read-only reference data lives (../shared/data, or $MDS_SHARED_DATA).

Without a GPU the Triton kernels run through Triton's interpreter. triton.jit reads TRITON_INTERPRET
when a kernel module is imported, and any test folder may import mds_model first, so it is set
here, before collection."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# DeepSpeed JIT-builds its shared-memory comm op on CPU in a cache shared by every environment
# of the user (~/.cache/torch_extensions); environments of other checkouts rewrite its build file
# and each rebuild costs a spawned run a minute. One cache per environment, built once.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder. Missing data is a failure, never a skip: CI has it."""
    path = Path(os.environ.get("MDS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (path / "gpt2-vocab.json").is_file():
        pytest.fail(f"shared data not found at {path}; set MDS_SHARED_DATA to the folder")
    return path


@pytest.fixture(scope="session")
def runs():
    """tests/train/runs.py, loaded once: launching real mds-train runs (the train, checkpoint
    and generate tests train with it)."""
    spec = importlib.util.spec_from_file_location("train_runs", REPO_ROOT / "tests/train/runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def host_profile():
    """benchmarks/host_profile.py, loaded once: the trace summaries of mds-train's --profile."""
    path = REPO_ROOT / "benchmarks/host_profile.py"
    spec = importlib.util.spec_from_file_location("host_profile", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """The sample-index cache the tests' training runs share."""
    return tmp_path_factory.mktemp("index-cache")


# Session fixtures that launch several processes: a test that uses one is in the multiprocess tier.
MULTIPROCESS_FIXTURES = {
    "tp2_run", "resumed_pp2", "resumed_dp2", "resumed_zero3", "tp2pp2_checkpoint", "zero3_run",
    "zero3_checkpoint", "tp2_pp2_checkpoint", "pp2_run", "pipeline_zero1_checkpoint",
    "universal_resumed_dp2", "pp2_zero1_run", "ds_universal",
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MULTIPROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.multiprocess)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # GPU tests use GPU-sized shapes; through the CPU interpreter they would run for hours.
    if "gpu" in item.keywords and not torch.cuda.is_available():
        pytest.fail("needs a CUDA GPU; on CPU run the suite with -m 'not gpu'", pytrace=False)
    # Read by runs.command, which refuses a multi-process launch from an unmarked test, so that
    # the quick tier (-m 'not multiprocess') stays what it says.
    os.environ["MDS_TEST_MULTIPROCESS"] = "1" if "multiprocess" in item.keywords else "0"


# DeepSpeed's CPU shared-memory all-reduce creates a 67 MB /dev/shm buffer per rank and run and
# never unlinks it; over the suite's spawned runs they would fill the RAM-backed /dev/shm. Buffers
# older than two minutes are past their run's start-up (when ranks open them by name) and go.
_SHM_BUFFERS = Path("/dev/shm")
_SHM_MIN_AGE_S = 120


def pytest_runtest_teardown(item: pytest.Item) -> None:  # noqa: ARG001 - pytest's signature
    import time

    cutoff = time.time() - _SHM_MIN_AGE_S
    for buffer in _SHM_BUFFERS.glob("deepspeed_allreduce_buffer_*"):
        try:
            if buffer.stat().st_mtime < cutoff:
                buffer.unlink()
        except OSError:  # gone already, or not ours to remove
            pass
