"""Fixtures of the mds-indexed-data tests: golden Megatron dataset, pure-Python twin, writers."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from mds_indexed_data import IndexedDatasetWriter

GOLDEN_NAME = "megatron-golden/meg-gpt2-openwebtext_text_document"


@pytest.fixture(scope="session")
def golden_prefix(shared_data) -> Path:
    prefix = shared_data / GOLDEN_NAME
    if not Path(f"{prefix}.idx").is_file():
        pytest.fail(f"golden dataset missing: {prefix}.idx")
    return prefix


@pytest.fixture(scope="session")
def twin():
    """megatron_twin.py as a module (pytest runs with --import-mode=importlib)."""
    path = Path(__file__).with_name("megatron_twin.py")
    spec = importlib.util.spec_from_file_location("megatron_twin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def make_dataset():
    """make_dataset(prefix, sizes, seed=0, dtype=uint16) writes random documents of those sizes."""

    def make(prefix, sizes, *, seed: int = 0, dtype=np.uint16, vocab: int = 5000) -> Path:
        return write_dataset(
            Path(prefix), synthetic_documents(sizes, seed=seed, vocab=vocab), dtype
        )

    return make


def write_dataset(prefix: Path, documents, dtype=np.uint16) -> Path:
    """Writes one item per document; returns the prefix."""
    with IndexedDatasetWriter(prefix, dtype=dtype) as writer:
        for tokens in documents:
            writer.add_document(np.asarray(tokens))
    return prefix


def synthetic_documents(sizes, *, seed: int = 0, vocab: int = 5000):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(size)) for size in sizes]
