"""GPT training dataset of a split: sample i is L + 1 int64 tokens, as bigscience's `GPTDataset`.

Sample i reads row `shuffle_idx[i]` of sample_idx and concatenates the token runs it spans, so a
lookup costs O(L) and touches only the mapped pages it needs. Pickling (DataLoader workers under
spawn/forkserver) sends file paths, not arrays; the worker maps the same files again.
"""

from pathlib import Path

import numpy as np

from mds_indexed_data.reader import IndexedDatasetReader
from mds_indexed_data.sample_index import IndexMappings


class GPTDataset:
    """`len(ds)` samples (may exceed the requested count: a whole last epoch is indexed)."""

    def __init__(
        self,
        *,
        name: str,
        reader: IndexedDatasetReader,
        mappings: IndexMappings,
        document_range: tuple[int, int],
        num_samples_requested: int,
        cache_files: dict[str, Path] | None = None,
    ):
        self.name = name
        self.reader = reader
        self.document_range = document_range
        self.num_samples_requested = num_samples_requested
        self.num_epochs = mappings.num_epochs
        self.separate_last_epoch = mappings.separate_last_epoch
        self.doc_idx = mappings.doc_idx
        self.sample_idx = mappings.sample_idx
        self.shuffle_idx = mappings.shuffle_idx
        self.cache_files = cache_files

    def __len__(self) -> int:
        return self.sample_idx.shape[0] - 1

    def __getitem__(self, index: int) -> np.ndarray:
        parts = [self.reader.get(*span) for span in self.sample_spans(index)]
        if len(parts) == 1:
            return parts[0].astype(np.int64)
        return np.concatenate(parts).astype(np.int64, copy=False)

    def sample_spans(self, index: int) -> list[tuple[int, int, int]]:
        """(document, first token, number of tokens) of each document run that sample `index`
        spans, in order; the sample is their tokens back to back."""
        length = len(self)
        if not -length <= index < length:
            raise IndexError(f"sample {index} out of range for {self.name} dataset of {length}")
        row = int(self.shuffle_idx[index])
        first, first_offset = (int(v) for v in self.sample_idx[row])
        last, last_offset = (int(v) for v in self.sample_idx[row + 1])
        if first == last:
            return [(int(self.doc_idx[first]), first_offset, last_offset - first_offset + 1)]
        first_document = int(self.doc_idx[first])
        spans = [
            (first_document, first_offset, int(self.reader.sizes[first_document]) - first_offset)
        ]
        for k in range(first + 1, last):
            document = int(self.doc_idx[k])
            spans.append((document, 0, int(self.reader.sizes[document])))
        spans.append((int(self.doc_idx[last]), 0, last_offset + 1))
        return spans

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self.cache_files is not None:
            for name in ("doc_idx", "sample_idx", "shuffle_idx"):
                state[name] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.cache_files is not None:
            for name in ("doc_idx", "sample_idx", "shuffle_idx"):
                setattr(self, name, np.load(self.cache_files[name], mmap_mode="r"))
