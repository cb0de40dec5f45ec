"""Bad datasets that once passed silently, run through the installed `mds-index`: an `.idx` whose
header is valid but whose body is corrupt, an empty `.idx`, and a merge of datasets of different
vocabularies. Each command ends with one stderr line naming the file, a non-zero exit and nothing
written."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mds_common.tokenizer_record import GPT2_BPE, TokenizerRecord
from mds_indexed_data import IndexedDatasetReader

HEADER_SIZE = 34


def run_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mds_indexed_data", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mds-index") and ": error: " in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def golden_copy(golden_prefix: Path, folder: Path) -> tuple[Path, int]:
    """A copy of the golden dataset in `folder`; returns (prefix, number of items N)."""
    folder.mkdir()
    prefix = folder / "golden"
    shutil.copyfile(f"{golden_prefix}.idx", f"{prefix}.idx")
    shutil.copyfile(f"{golden_prefix}.bin", f"{prefix}.bin")
    return prefix, len(IndexedDatasetReader(golden_prefix))


def corrupt(path: Path, offset: int, values: np.ndarray) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + values.nbytes] = values.tobytes()
    path.write_bytes(bytes(raw))


def _garbage(prefix: Path, num_items: int) -> str:
    # What a disk or copy error leaves: random bytes over the start of the sizes.
    garbage = np.random.default_rng(0).integers(0, 256, 400, np.uint8)
    corrupt(Path(f"{prefix}.idx"), HEADER_SIZE, garbage)
    return "corrupt index: item "


def _negative_size(prefix: Path, num_items: int) -> str:
    corrupt(Path(f"{prefix}.idx"), HEADER_SIZE + 4 * 7, np.array([-5], np.int32))
    return "corrupt index: item 7 has -5 tokens (sizes must be >= 0)"


def _shifted_pointer(prefix: Path, num_items: int) -> str:
    offset = HEADER_SIZE + 4 * num_items + 8 * 500
    reader = IndexedDatasetReader(prefix)
    moved = int(reader.pointers[500]) + 2
    del reader
    corrupt(Path(f"{prefix}.idx"), offset, np.array([moved], np.int64))
    return f"corrupt index: item 500 points to byte {moved} of the .bin, but item 499 ends at"


def _decreasing_doc_idx(prefix: Path, num_items: int) -> str:
    corrupt(Path(f"{prefix}.idx"), HEADER_SIZE + 12 * num_items + 8 * 10, np.array([3], np.int64))
    return "corrupt index: doc_idx decreases at entry 10 (9 -> 3)"


def _doc_idx_end(prefix: Path, num_items: int) -> str:
    corrupt(Path(f"{prefix}.idx"), HEADER_SIZE + 12 * num_items + 8 * num_items, np.array([7]))
    return f"corrupt index: doc_idx runs from 0 to 7, not from 0 to the {num_items} items"


def _long_bin(prefix: Path, num_items: int) -> str:
    with open(f"{prefix}.bin", "ab") as data:
        data.write(b"\0\0")
    return "golden.bin: data file is 2723692 bytes but its index points to 2723690; the .bin is too"


CORRUPTIONS = [_garbage, _negative_size, _shifted_pointer, _decreasing_doc_idx, _doc_idx_end]


@pytest.mark.parametrize("corruption", [*CORRUPTIONS, _long_bin], ids=lambda f: f.__name__[1:])
def test_corrupt_body_is_refused_by_info(golden_prefix, tmp_path, corruption):
    prefix, num_items = golden_copy(golden_prefix, tmp_path / "data")
    message = corruption(prefix, num_items)
    result = run_command("info", prefix)
    line = assert_one_line_error(result, message)
    if corruption is not _long_bin:
        assert f"{prefix}.idx: corrupt index: " in line
        assert line.endswith("re-create the dataset (or restore its .idx)")
    assert result.stdout == ""


@pytest.mark.parametrize(
    "command",
    [
        ["show", "{prefix}", "--doc", "0"],
        [
            "build",
            "--data-path",
            "{prefix}",
            "--seq-length",
            "8",
            "--train-samples",
            "5",
            "--cache-dir",
            "{tmp}/cache",
        ],
        ["merge", "--datasets", "{prefix}", "{prefix}", "--output-prefix", "{tmp}/merged"],
    ],  # fmt: skip
    ids=lambda command: command[0],
)
def test_corrupt_body_is_refused_by_every_command(golden_prefix, tmp_path, command):
    prefix, num_items = golden_copy(golden_prefix, tmp_path / "data")
    message = _garbage(prefix, num_items)
    result = run_command(*[arg.format(prefix=prefix, tmp=tmp_path) for arg in command])
    assert_one_line_error(result, f"{prefix}.idx: {message}")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data"]
    assert sorted(path.name for path in (tmp_path / "data").iterdir()) == [
        "golden.bin",
        "golden.idx",
    ]


def test_empty_files_are_named(tmp_path):
    """Two 0-byte files (a copy cut short, a `touch`): numpy's own error named neither."""
    prefix = tmp_path / "empty"
    for suffix in (".bin", ".idx"):
        Path(f"{prefix}{suffix}").touch()
    result = run_command("info", prefix)
    assert_one_line_error(
        result, f"{prefix}.idx: empty file (0 bytes), not an index; write the dataset again"
    )


def _hashed(vocab: Path, merges: Path) -> dict:
    return TokenizerRecord.of_files(GPT2_BPE, [vocab, merges]).to_json()


def _sidecar(prefix: Path, vocab: Path, merges: Path, *, hashed: bool) -> None:
    """The sidecar mds-tokenize writes (`vocabulary`, hashed) or an older one (`config` only)."""
    if hashed:
        metadata = {"tool": "mds-tokenize", "vocabulary": _hashed(vocab, merges)}
    else:
        metadata = {
            "tool": "mds-tokenize",
            "config": {"vocab_file": str(vocab), "merge_file": str(merges)},
        }
    Path(f"{prefix}.tokenize.json").write_text(json.dumps(metadata))


@pytest.mark.parametrize("hashed", [True, False])
def test_merge_refuses_datasets_of_different_vocabularies(tmp_path, make_dataset, hashed):
    files = {}
    for name, text in [("a", "vocab A"), ("b", "vocab B")]:
        files[name] = (tmp_path / f"{name}-vocab.json", tmp_path / f"{name}-merges.txt")
        files[name][0].write_text(text)
        files[name][1].write_text("#version: 0.2\n")
    first = make_dataset(tmp_path / "first", [5, 6])
    second = make_dataset(tmp_path / "second", [7])
    _sidecar(first, *files["a"], hashed=hashed)
    _sidecar(second, *files["b"], hashed=hashed)
    result = run_command("merge", "--datasets", first, second, "--output-prefix", tmp_path / "out")
    assert_one_line_error(
        result,
        f"{second} was tokenized with {files['b'][0]} + {files['b'][1]}, {first} with "
        f"{files['a'][0]} + {files['a'][1]}: their token ids mean different things; merge only "
        "datasets tokenized with the same vocabulary (re-tokenize one of them)",
    )
    assert not list(tmp_path.glob("out*"))
    # A copy of the same files elsewhere is the same vocabulary: merged, and recorded in the output.
    copies = tmp_path / "copies"
    copies.mkdir()
    for path in files["a"]:
        shutil.copyfile(path, copies / path.name)
    _sidecar(second, copies / files["a"][0].name, copies / files["a"][1].name, hashed=hashed)
    result = run_command("merge", "--datasets", first, second, "--output-prefix", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    recorded = json.loads((tmp_path / "out.merge.json").read_text())["vocabulary"]
    assert recorded["vocab_file"] == str(files["a"][0])
