"""Megatron-compatible mmap indexed datasets (`.bin`/`.idx`, magic `MMIDIDX`) and GPT samples.

This package owns the on-disk format; every other mds tool reads and writes it through
`IndexedDatasetReader`, `IndexedDatasetWriter` and `merge_datasets`. The names are imported on
first use, so that `mds-index --help` and `--version` start without loading numpy.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mds_indexed_data.blending import BlendedDataset
    from mds_indexed_data.build import (
        BlendSummary,
        DatasetsBuild,
        SplitSummary,
        build_train_valid_test_datasets,
        format_summary,
    )
    from mds_indexed_data.config import GPTDataConfig, parse_data_path, samples_from_iterations
    from mds_indexed_data.errors import IndexedDatasetError
    from mds_indexed_data.gpt_dataset import GPTDataset
    from mds_indexed_data.merge import merge_datasets
    from mds_indexed_data.mmap_format import best_fitting_dtype, data_file_path, index_file_path
    from mds_indexed_data.reader import IndexedDatasetReader
    from mds_indexed_data.vocabulary import describe_vocabulary
    from mds_indexed_data.writer import IndexedDatasetWriter

_EXPORTS = {
    "BlendedDataset": "mds_indexed_data.blending",
    "BlendSummary": "mds_indexed_data.build",
    "DatasetsBuild": "mds_indexed_data.build",
    "SplitSummary": "mds_indexed_data.build",
    "build_train_valid_test_datasets": "mds_indexed_data.build",
    "format_summary": "mds_indexed_data.build",
    "GPTDataConfig": "mds_indexed_data.config",
    "parse_data_path": "mds_indexed_data.config",
    "samples_from_iterations": "mds_indexed_data.config",
    "IndexedDatasetError": "mds_indexed_data.errors",
    "GPTDataset": "mds_indexed_data.gpt_dataset",
    "merge_datasets": "mds_indexed_data.merge",
    "best_fitting_dtype": "mds_indexed_data.mmap_format",
    "data_file_path": "mds_indexed_data.mmap_format",
    "index_file_path": "mds_indexed_data.mmap_format",
    "IndexedDatasetReader": "mds_indexed_data.reader",
    "IndexedDatasetWriter": "mds_indexed_data.writer",
    "describe_vocabulary": "mds_indexed_data.vocabulary",
}
__all__ = [
    "BlendSummary",
    "BlendedDataset",
    "DatasetsBuild",
    "GPTDataConfig",
    "GPTDataset",
    "SplitSummary",
    "build_train_valid_test_datasets",
    "format_summary",
    "parse_data_path",
    "samples_from_iterations",
    "IndexedDatasetError",
    "IndexedDatasetReader",
    "IndexedDatasetWriter",
    "best_fitting_dtype",
    "data_file_path",
    "describe_vocabulary",
    "index_file_path",
    "merge_datasets",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
