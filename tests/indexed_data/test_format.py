"""The .bin/.idx reader, writer and merge against bigscience's golden 1000-document dataset."""

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from mds_indexed_data import (
    IndexedDatasetError,
    IndexedDatasetReader,
    IndexedDatasetWriter,
    best_fitting_dtype,
    merge_datasets,
)


def _bytes(prefix) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def test_golden_header_and_arrays(golden_prefix):
    reader = IndexedDatasetReader(golden_prefix)
    assert reader.dtype == np.uint16
    assert len(reader) == 1000 and reader.num_documents == 1000
    assert reader.num_tokens == 1_361_845
    assert list(reader.doc_idx) == list(range(1001))
    assert reader.pointers[0] == 0
    np.testing.assert_array_equal(np.diff(reader.pointers), reader.sizes[:-1].astype(np.int64) * 2)
    raw = Path(f"{golden_prefix}.bin").read_bytes()
    flat = np.frombuffer(raw, dtype="<u2")
    assert len(flat) == reader.num_tokens
    # Every document ends with the tiny vocabulary's EOD (4999) and holds no other.
    for i in range(len(reader)):
        item = reader[i]
        assert item[-1] == 4999 and np.count_nonzero(item == 4999) == 1
    start = int(reader.pointers[7]) // 2
    np.testing.assert_array_equal(reader.get(7), flat[start : start + reader.sizes[7]])
    np.testing.assert_array_equal(reader.get(7, 5, 3), flat[start + 5 : start + 8])
    assert reader.item_bytes(3, 5) == (int(reader.pointers[3]), int(reader.pointers[5]))


def test_rewriting_golden_items_is_byte_identical(golden_prefix, tmp_path):
    reader = IndexedDatasetReader(golden_prefix)
    with IndexedDatasetWriter(tmp_path / "copy", dtype=best_fitting_dtype(5000)) as writer:
        for i in range(len(reader)):
            writer.add_document(reader[i])
    assert _bytes(tmp_path / "copy") == _bytes(golden_prefix)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.bin", "copy.idx"]


def test_bulk_add_documents_is_byte_identical(golden_prefix, tmp_path):
    reader = IndexedDatasetReader(golden_prefix)
    flat = np.concatenate([reader[i] for i in range(len(reader))])
    with IndexedDatasetWriter(tmp_path / "bulk", dtype=np.uint16) as writer:
        writer.add_documents(flat[: reader.pointers[400] // 2], reader.sizes[:400])
        writer.add_documents(flat[reader.pointers[400] // 2 :], reader.sizes[400:])
    assert _bytes(tmp_path / "bulk") == _bytes(golden_prefix)


def test_split_then_merge_reproduces_golden(golden_prefix, tmp_path):
    reader = IndexedDatasetReader(golden_prefix)
    bounds = [0, 333, 334, 1000]  # includes a one-document shard
    shards = []
    for k in range(3):
        shard = tmp_path / f"shard{k}"
        with IndexedDatasetWriter(shard, dtype=np.uint16) as writer:
            for i in range(bounds[k], bounds[k + 1]):
                writer.add_document(reader[i])
        shards.append(shard)
    merged = merge_datasets(shards, tmp_path / "merged")
    assert _bytes(tmp_path / "merged") == _bytes(golden_prefix)
    assert merged.num_documents == 1000


def test_merge_shifts_doc_idx_of_sentence_level_items(tmp_path):
    with IndexedDatasetWriter(tmp_path / "a", dtype=np.int32) as writer:
        writer.add_item([1, 2])
        writer.add_item([3])
        writer.end_document()
        writer.add_document([4])
    with IndexedDatasetWriter(tmp_path / "b", dtype=np.int32) as writer:
        writer.add_item([70000])
        writer.add_item([6, 7])
        writer.end_document()
    merged = merge_datasets([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert list(merged.sizes) == [2, 1, 1, 1, 2]
    assert list(merged.pointers) == [0, 8, 12, 16, 20]
    assert list(merged.doc_idx) == [0, 2, 3, 5]
    assert merged.dtype == np.int32 and list(merged[3]) == [70000]


def test_merge_dtype_mismatch_is_an_error(tmp_path, make_dataset):
    make_dataset(tmp_path / "u16", [3, 4])
    make_dataset(tmp_path / "i32", [3], dtype=np.int32)
    with pytest.raises(
        IndexedDatasetError, match=r"i32\.idx: token dtype int32 differs from uint16"
    ):
        merge_datasets([tmp_path / "u16", tmp_path / "i32"], tmp_path / "out")
    assert not list(tmp_path.glob("out*"))


def test_best_fitting_dtype():
    assert best_fitting_dtype(50257) == np.uint16
    assert best_fitting_dtype(65499) == np.uint16
    assert best_fitting_dtype(65500) == np.int32
    assert best_fitting_dtype(None) == np.int32


def test_writer_abort_and_exception_leave_nothing(tmp_path):
    writer = IndexedDatasetWriter(tmp_path / "x", dtype=np.uint16)
    writer.add_document([1, 2, 3])
    writer.abort()
    with pytest.raises(RuntimeError):
        with IndexedDatasetWriter(tmp_path / "y", dtype=np.uint16) as writer:
            writer.add_document([1])
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_tokens_that_do_not_fit(tmp_path):
    with IndexedDatasetWriter(tmp_path / "x", dtype=np.uint16) as writer:
        with pytest.raises(ValueError, match="do not fit uint16"):
            writer.add_item([1, 70000])


def test_reader_pickles_by_prefix(golden_prefix):
    reader = IndexedDatasetReader(golden_prefix)
    payload = pickle.dumps(reader)
    assert len(payload) < 1000  # the tokens are mapped again, not copied
    clone = pickle.loads(payload)
    np.testing.assert_array_equal(clone[999], reader[999])


# ---- validation errors: each names the file and says what is wrong -------------------------------


@pytest.fixture
def small(tmp_path, make_dataset):
    return make_dataset(tmp_path / "small", [5, 7, 2])


def _patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def test_missing_idx(tmp_path):
    with pytest.raises(
        IndexedDatasetError, match=r"nope\.idx: index file not found; pass the prefix"
    ):
        IndexedDatasetReader(tmp_path / "nope")


def test_missing_bin(small):
    Path(f"{small}.bin").unlink()
    with pytest.raises(IndexedDatasetError, match=r"small\.bin: data file not found"):
        IndexedDatasetReader(small)


def test_bad_magic(small):
    _patch(Path(f"{small}.idx"), 0, b"TNTIDX\x00\x00")
    with pytest.raises(
        IndexedDatasetError, match=r"small\.idx: not a Megatron mmap index \(bad magic"
    ):
        IndexedDatasetReader(small)


def test_bad_version(small):
    _patch(Path(f"{small}.idx"), 9, struct.pack("<Q", 2))
    with pytest.raises(IndexedDatasetError, match="unsupported index version 2"):
        IndexedDatasetReader(small)


def test_unknown_dtype_code(small):
    _patch(Path(f"{small}.idx"), 17, bytes([9]))
    with pytest.raises(IndexedDatasetError, match="unknown dtype code 9"):
        IndexedDatasetReader(small)


def test_truncated_header(small):
    path = Path(f"{small}.idx")
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(IndexedDatasetError, match=r"truncated index \(20 bytes, the header alone"):
        IndexedDatasetReader(small)


def test_truncated_arrays(small):
    path = Path(f"{small}.idx")
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(IndexedDatasetError, match=r"truncated index \(94 bytes, header says 102\)"):
        IndexedDatasetReader(small)


def test_short_bin(small):
    path = Path(f"{small}.bin")
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(
        IndexedDatasetError, match="data file is 26 bytes but its index points to 28"
    ):
        IndexedDatasetReader(small)


def test_empty_dataset_round_trip(tmp_path):
    with IndexedDatasetWriter(tmp_path / "empty", dtype=np.uint16):
        pass
    reader = IndexedDatasetReader(tmp_path / "empty")
    assert len(reader) == 0 and reader.num_tokens == 0 and list(reader.doc_idx) == [0]
