"""Shared fixtures: where the read-only reference data lives (../shared/data, or $MDS_SHARED_DATA).

Without a GPU the Triton kernels run through Triton's interpreter. triton.jit reads TRITON_INTERPRET
when a kernel module is imported, and any test folder may import mds_model first, so it is set
here, before collection."""

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder. Missing data is a failure, never a skip: CI has it."""
    path = Path(os.environ.get("MDS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (path / "gpt2-vocab.json").is_file():
        pytest.fail(f"shared data not found at {path}; set MDS_SHARED_DATA to the folder")
    return path


def pytest_runtest_setup(item: pytest.Item) -> None:
    # GPU tests use GPU-sized shapes; through the CPU interpreter they would run for hours.
    if "gpu" in item.keywords and not torch.cuda.is_available():
        pytest.fail("needs a CUDA GPU; on CPU run the suite with -m 'not gpu'", pytrace=False)


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
