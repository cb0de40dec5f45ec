"""Shared fixtures: where the read-only reference data lives (../shared/data, or $MDS_SHARED_DATA)."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder. Missing data is a failure, never a skip: CI has it."""
    path = Path(os.environ.get("MDS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (path / "gpt2-vocab.json").is_file():
        pytest.fail(f"shared data not found at {path}; set MDS_SHARED_DATA to the folder")
    return path
