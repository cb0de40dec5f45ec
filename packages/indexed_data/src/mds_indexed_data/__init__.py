"""Megatron-compatible mmap indexed datasets (`.bin`/`.idx`, magic `MMIDIDX`) and GPT samples.

This package owns the on-disk format; every other mds tool reads and writes it through
`IndexedDatasetReader`, `IndexedDatasetWriter` and `merge_datasets`. The names are imported on
first use, so that `mds-index --help` and `--version` start without loading numpy.
"""

from typing import TYPE_CHECKING

from mds_common.lazy import lazy_attributes

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
    from mds_indexed_data.vocabulary import recorded_vocabulary
    from mds_indexed_data.writer import IndexedDatasetWriter

_MODULE_OF = {
    "BlendedDataset": "blending",
    "BlendSummary": "build",
    "DatasetsBuild": "build",
    "SplitSummary": "build",
    "build_train_valid_test_datasets": "build",
    "format_summary": "build",
    "GPTDataConfig": "config",
    "parse_data_path": "config",
    "samples_from_iterations": "config",
    "IndexedDatasetError": "errors",
    "GPTDataset": "gpt_dataset",
    "merge_datasets": "merge",
    "best_fitting_dtype": "mmap_format",
    "data_file_path": "mmap_format",
    "index_file_path": "mmap_format",
    "IndexedDatasetReader": "reader",
    "IndexedDatasetWriter": "writer",
    "recorded_vocabulary": "vocabulary",
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
    "index_file_path",
    "merge_datasets",
    "recorded_vocabulary",
]


__getattr__, __dir__ = lazy_attributes(__name__, _MODULE_OF)
