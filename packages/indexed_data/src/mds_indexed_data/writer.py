"""Streaming `.bin`/`.idx` writer, byte-identical to Megatron's `MMapIndexedDatasetBuilder`.

Both files are written under temporary names (`mds_common.files.AtomicFile`) and renamed into
place by `finalize()`, `.bin` first, so a visible `.idx` always means a complete dataset; a failure
removes the temporaries, and those of killed runs are removed by the next writer of the dataset.
"""

from array import array
from pathlib import Path

import numpy as np
from mds_common.files import AtomicFile

from mds_indexed_data.mmap_format import data_file_path, encode_header, index_file_path
from mds_indexed_data.reader import IndexedDatasetReader


class IndexedDatasetWriter:
    """Appends items and document ends; use as a context manager or call finalize()/abort()."""

    def __init__(self, prefix: str | Path, *, dtype: np.dtype):
        self.dtype = np.dtype(dtype)
        self.index_path = index_file_path(prefix)
        self.data_path = data_file_path(prefix)
        self._data_file = AtomicFile(self.data_path, "wb")
        self._data = self._data_file.file
        self._sizes = array("i")
        self._doc_idx = array("q", [0])
        self._closed = False

    @property
    def num_items(self) -> int:
        return len(self._sizes)

    def _as_tokens(self, tokens) -> np.ndarray:
        if isinstance(tokens, np.ndarray) and tokens.dtype == self.dtype:
            return tokens
        tokens = np.asarray(tokens)
        if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token ids {tokens.min()}..{tokens.max()} do not fit {self.dtype}")
        return tokens.astype(self.dtype, copy=False)

    def add_item(self, tokens) -> None:
        tokens = self._as_tokens(tokens)
        self._data.write(tokens.tobytes(order="C"))
        self._sizes.append(len(tokens))

    def end_document(self) -> None:
        self._doc_idx.append(len(self._sizes))

    def add_document(self, tokens) -> None:
        self.add_item(tokens)
        self.end_document()

    def add_documents(
        self, flat_tokens, lengths, *, deepspeedai: bool = False, uncounted_eod: bool = False
    ) -> None:
        """Bulk form of add_document: one item per entry of `lengths`, tokens back to back.
        `deepspeedai`: the index deepspeedai/Megatron-DeepSpeed's `preprocess_data.py` (6acc370a)
        writes (README: "Uncounted end-of-document tokens"): a 0 length is an empty document (a
        doc_idx entry without an item), and with `uncounted_eod` (its --append-eod) each item's
        size leaves out its last token, the EOD, which the .bin holds."""
        flat_tokens = self._as_tokens(flat_tokens)
        lengths = np.asarray(lengths, dtype=np.int32)
        assert int(lengths.sum(dtype=np.int64)) == len(flat_tokens)
        first = len(self._sizes)
        self._data.write(flat_tokens.tobytes(order="C"))
        if deepspeedai:
            non_empty = lengths > 0
            sizes = lengths[non_empty] - int(uncounted_eod)
            self._sizes.frombytes(sizes.astype(np.int32).tobytes())
            self._doc_idx.frombytes((first + np.cumsum(non_empty, dtype=np.int64)).tobytes())
            return
        self._sizes.frombytes(lengths.tobytes())
        self._doc_idx.frombytes(
            np.arange(first + 1, first + len(lengths) + 1, dtype=np.int64).tobytes()
        )

    def add_dataset(self, reader: IndexedDatasetReader) -> None:
        """Appends every item and document of another dataset (Megatron's merge semantics)."""
        if reader.dtype != self.dtype:
            raise ValueError(f"dtype {reader.dtype} of {reader.prefix} differs from {self.dtype}")
        offset = len(self._sizes)
        begin, end = reader.item_bytes(0, len(reader))
        with open(reader.data_path, "rb") as source:
            source.seek(begin)
            _copy_bytes(source, self._data, end - begin)
        self._sizes.frombytes(np.ascontiguousarray(reader.sizes, dtype=np.int32).tobytes())
        self._doc_idx.frombytes((np.asarray(reader.doc_idx[1:], dtype=np.int64) + offset).tobytes())

    def finalize(self) -> None:
        sizes = np.frombuffer(self._sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum(sizes[:-1], dtype=np.int64, out=pointers[1:])
        pointers *= self.dtype.itemsize
        index_file = AtomicFile(self.index_path, "wb")
        try:
            index = index_file.file
            index.write(
                encode_header(
                    dtype=self.dtype, num_items=len(sizes), num_doc_idx=len(self._doc_idx)
                )
            )
            index.write(sizes.tobytes())
            index.write(pointers.tobytes())
            index.write(np.frombuffer(self._doc_idx, dtype=np.int64).tobytes())
            self._data_file.commit()
            index_file.commit()
        except BaseException:
            if not index_file.done:
                index_file.abort()
            self.abort()
            raise
        self._closed = True

    def abort(self) -> None:
        if not self._data_file.done:
            self._data_file.abort()
        self._closed = True

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if self._closed:
            return
        if exc_type is None:
            self.finalize()
        else:
            self.abort()


def _copy_bytes(source, destination, num_bytes: int, chunk: int = 64 << 20) -> None:
    while num_bytes > 0:
        block = source.read(min(chunk, num_bytes))
        if not block:
            raise OSError(f"{source.name}: ended {num_bytes} bytes early")
        destination.write(block)
        num_bytes -= len(block)
