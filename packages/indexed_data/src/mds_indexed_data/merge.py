"""Concatenation of datasets, as bigscience's `tools/merge_preprocessed_data.py` (serial mode).

Items and documents keep their order; doc_idx entries are shifted by the items already present and
pointers are recomputed, so merging shards of one input equals tokenizing the input in one run.
Inputs whose sidecars record different vocabularies are refused (vocabulary.py).
"""

from collections.abc import Sequence
from pathlib import Path

from mds_common.sidecar import write_sidecar
from mds_common.tokenizer_record import TokenizerRecord

from mds_indexed_data.errors import IndexedDatasetError
from mds_indexed_data.reader import IndexedDatasetReader
from mds_indexed_data.vocabulary import recorded_vocabulary
from mds_indexed_data.writer import IndexedDatasetWriter


def merge_datasets(
    prefixes: Sequence[str | Path], output_prefix: str | Path
) -> IndexedDatasetReader:
    """Writes `output_prefix.{bin,idx}` holding every input in order; returns a reader of it."""
    if not prefixes:
        raise IndexedDatasetError("merge needs at least one input dataset")
    readers = [IndexedDatasetReader(prefix) for prefix in prefixes]
    check_same_vocabulary(prefixes)
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


def check_same_vocabulary(prefixes: Sequence[str | Path]) -> TokenizerRecord | None:
    """Raises IndexedDatasetError naming two datasets whose sidecars record different vocabularies;
    returns the common vocabulary (None when no input records one)."""
    known = [
        (prefix, vocabulary) for prefix in prefixes if (vocabulary := recorded_vocabulary(prefix))
    ]
    for prefix, vocabulary in known[1:]:
        first_prefix, first = known[0]
        if not first.same_as(vocabulary):
            raise IndexedDatasetError(
                f"{prefix} was tokenized with {vocabulary.label()}, {first_prefix} with "
                f"{first.label()}: their token ids mean different things; merge only "
                "datasets tokenized with the same vocabulary (re-tokenize one of them)"
            )
    return known[0][1] if known else None


def write_merge_metadata(prefixes: Sequence[str | Path], merged: IndexedDatasetReader) -> Path:
    """`OUT.merge.json` beside a merged dataset: the tool, its version, the inputs in order and the
    counts, written to a temporary name and renamed like the dataset itself."""
    path = Path(f"{merged.prefix}.merge.json")
    vocabulary = check_same_vocabulary(prefixes)
    # The inputs' record as read, so that merging this output is checked too.
    extra = {} if vocabulary is None else {"vocabulary": vocabulary.to_json()}
    write_sidecar(
        path,
        tool="mds-index merge",
        distribution="mds-indexed-data",
        inputs=prefixes,
        output_prefix=str(Path(merged.prefix).resolve()),
        num_documents=merged.num_documents,
        num_items=len(merged),
        num_tokens=merged.num_tokens,
        dtype=str(merged.dtype),
        **extra,
    )
    return path
