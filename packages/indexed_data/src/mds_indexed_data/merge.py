"""Concatenation of datasets, as bigscience's `tools/merge_preprocessed_data.py` (serial mode).

Items and documents keep their order; doc_idx entries are shifted by the items already present and
pointers are recomputed, so merging shards of one input equals tokenizing the input in one run.
"""

import importlib.metadata
import json
import os
from collections.abc import Sequence
from pathlib import Path

from mds_indexed_data.errors import IndexedDatasetError
from mds_indexed_data.reader import IndexedDatasetReader
from mds_indexed_data.writer import IndexedDatasetWriter


def merge_datasets(
    prefixes: Sequence[str | Path], output_prefix: str | Path
) -> IndexedDatasetReader:
    """Writes `output_prefix.{bin,idx}` holding every input in order; returns a reader of it."""
    if not prefixes:
        raise IndexedDatasetError("merge needs at least one input dataset")
    readers = [IndexedDatasetReader(prefix) for prefix in prefixes]
    dtype = readers[0].dtype
    for reader in readers[1:]:
        if reader.dtype != dtype:
            raise IndexedDatasetError(
                f"{reader.index_path}: token dtype {reader.dtype} differs from {dtype} of "
                f"{readers[0].index_path}; re-tokenize with the same vocabulary before merging"
            )
    with IndexedDatasetWriter(output_prefix, dtype=dtype) as writer:
        for reader in readers:
            writer.add_dataset(reader)
    return IndexedDatasetReader(output_prefix)


def write_merge_metadata(prefixes: Sequence[str | Path], merged: IndexedDatasetReader) -> Path:
    """`OUT.merge.json` beside a merged dataset: the tool, its version, the inputs in order and the
    counts, written to a temporary name and renamed like the dataset itself."""
    path = Path(f"{merged.prefix}.merge.json")
    description = {
        "tool": "mds-index merge",
        "version": importlib.metadata.version("mds-indexed-data"),
        "inputs": [str(Path(prefix).resolve()) for prefix in prefixes],
        "output_prefix": str(Path(merged.prefix).resolve()),
        "num_documents": merged.num_documents,
        "num_items": len(merged),
        "num_tokens": merged.num_tokens,
        "dtype": str(merged.dtype),
    }
    temporary = path.with_name(path.name + f".tmp-{os.getpid()}")
    temporary.write_text(json.dumps(description, indent=2) + "\n")
    os.replace(temporary, path)
    return path
