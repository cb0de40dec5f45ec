"""Read-only, memory-mapped view of a `.bin`/`.idx` pair; validates before anything is used.

The `.bin` is never read into memory: items are numpy views into the mapping, so readers are cheap
to open in every DataLoader worker.
"""

import logging
from pathlib import Path

import numpy as np

from mds_indexed_data.errors import IndexedDatasetError
from mds_indexed_data.mmap_format import (
    HEADER_SIZE,
    check_index_body,
    data_file_path,
    decode_header,
    index_file_path,
    index_file_size,
    uncounted_eod_tokens,
)

logger = logging.getLogger(__name__)


class IndexedDatasetReader:
    """Items (Megatron's unit; one per document unless sentences were split) of a dataset prefix."""

    def __init__(self, prefix: str | Path, *, validate: bool = True):
        """Checks the header, then (unless `validate` is False: a copy of a checked reader) every
        size, pointer and doc_idx entry against the `.bin`; raises IndexedDatasetError."""
        self.prefix = str(prefix)
        self.index_path = index_file_path(prefix)
        self.data_path = data_file_path(prefix)
        if not self.index_path.is_file():
            raise IndexedDatasetError(
                f"{self.index_path}: index file not found; pass the prefix without .bin/.idx"
            )
        if not self.data_path.is_file():
            raise IndexedDatasetError(f"{self.data_path}: data file not found next to its index")

        if self.index_path.stat().st_size == 0:  # np.memmap's error would not name it
            raise IndexedDatasetError(
                f"{self.index_path}: empty file (0 bytes), not an index; write the dataset "
                "again with mds-tokenize"
            )
        index = np.memmap(self.index_path, dtype=np.uint8, mode="r")
        self.dtype, num_items, num_doc_idx = decode_header(
            bytes(index[:HEADER_SIZE]), self.index_path
        )
        expected = index_file_size(num_items, num_doc_idx)
        if index.size != expected:
            raise IndexedDatasetError(
                f"{self.index_path}: {'truncated' if index.size < expected else 'overlong'} index "
                f"({index.size} bytes, header says {expected})"
            )
        buffer = index._mmap  # the raw mapping; np.frombuffer keeps it alive
        self.sizes = np.frombuffer(buffer, np.int32, num_items, HEADER_SIZE)
        self.pointers = np.frombuffer(buffer, np.int64, num_items, HEADER_SIZE + 4 * num_items)
        self.doc_idx = np.frombuffer(buffer, np.int64, num_doc_idx, HEADER_SIZE + 12 * num_items)

        data_bytes = self.data_path.stat().st_size
        # np.memmap refuses empty files, and an empty dataset has nothing to map.
        self._tokens = (
            np.memmap(self.data_path, dtype=self.dtype, mode="r")
            if data_bytes and data_bytes % self.dtype.itemsize == 0
            else np.empty(0, self.dtype)
        )
        # deepspeedai's --append-eod files: read as the index says, as upstream reads them.
        self.num_uncounted_eods = uncounted_eod_tokens(
            sizes=self.sizes,
            doc_idx=self.doc_idx,
            itemsize=self.dtype.itemsize,
            data_bytes=data_bytes,
            tokens=self._tokens,
        )
        if validate:
            check_index_body(
                sizes=self.sizes,
                pointers=self.pointers,
                doc_idx=self.doc_idx,
                itemsize=self.dtype.itemsize,
                data_bytes=data_bytes - self.num_uncounted_eods * self.dtype.itemsize,
                index_path=self.index_path,
                data_path=self.data_path,
            )
            if self.num_uncounted_eods:
                logger.warning(
                    "%s: deepspeedai/Megatron-DeepSpeed's --append-eod layout (its sizes leave "
                    "out each document's end-of-document token, which the .bin holds); read as "
                    "its index says, as upstream reads it: documents start up to %d tokens early "
                    "and the last %d tokens are never read",
                    self.data_path,
                    self.num_uncounted_eods - 1,
                    self.num_uncounted_eods,
                )

    def __len__(self) -> int:
        return len(self.sizes)

    # Pickling (DataLoader workers under spawn/forkserver) sends the prefix and maps the files
    # again, instead of copying every token through a pipe.
    def __getstate__(self) -> dict:
        return {"prefix": self.prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["prefix"], validate=False)  # checked where it was first opened

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    @property
    def num_documents(self) -> int:
        return max(len(self.doc_idx) - 1, 0)

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """`length` tokens of item `index` from token `offset` (Megatron's `get`), as a view."""
        size = int(self.sizes[index])
        if length is None:
            length = size - offset
        start = int(self.pointers[index]) // self.dtype.itemsize + offset
        return self._tokens[start : start + length]

    def __getitem__(self, index: int) -> np.ndarray:
        return self.get(index)

    def item_bytes(self, start: int, stop: int) -> tuple[int, int]:
        """Byte range [begin, end) of the `.bin` that holds items start..stop-1."""
        if start >= stop:
            return 0, 0
        begin = int(self.pointers[start])
        return begin, int(self.pointers[stop - 1]) + int(self.sizes[stop - 1]) * self.dtype.itemsize
