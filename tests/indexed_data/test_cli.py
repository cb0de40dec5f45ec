"""`mds-index build|merge|info|show`: outputs, and one clear stderr line per user mistake."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mds_indexed_data import IndexedDatasetReader
from mds_indexed_data.cli import main


def run(capsys, *args) -> tuple[int, str, str]:
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *fragments):
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_build_prints_summary_and_caches(capsys, golden_prefix, tmp_path):
    args = ["build", "--data-path", golden_prefix, "--split", "949,50,1", "--seq-length", 1024]
    args += ["--train-iters", 100, "--global-batch-size", 16, "--eval-interval", 1000]
    args += ["--eval-iters", 10, "--seed", 1234, "--cache-dir", tmp_path]
    code, out, _ = run(capsys, *args)
    assert code == 0
    assert "target sizes: train 1600, valid 160, test 160" in out
    assert "train " in out and "documents [0, 949) = 949, tokens 1303056, epochs 2 " in out
    assert (
        "(last epoch shuffled separately)" in out and "samples requested 1600 available 2545" in out
    )
    assert "documents [999, 1000) = 1, tokens 758, epochs 217" in out
    assert len(list(tmp_path.glob("*.npy"))) == 9 and len(list(tmp_path.glob("*.json"))) == 3
    code, out, _ = run(capsys, *args)
    assert code == 0 and out.count("cache hit") == 3


def test_build_blend_prints_ratios(capsys, tmp_path, make_dataset):
    a = make_dataset(tmp_path / "a", [50] * 40, seed=1)
    b = make_dataset(tmp_path / "b", [70] * 40, seed=2)
    args = ["build", "--data-path", "0.35", a, "0.65", b, "--split", "100,0,0"]
    code, out, err = run(capsys, *args, "--seq-length", 16, "--train-samples", 200)
    assert code == 0, err
    assert "train blend of 2 datasets" in out
    assert "dataset 0, input: 0.35, achieved: 0.3" in out
    assert "dataset 1, input: 0.65, achieved: 0.6" in out


def test_merge_info_and_show(capsys, tmp_path, make_dataset):
    make_dataset(tmp_path / "p1", [3, 1], seed=1)
    make_dataset(tmp_path / "p2", [4], seed=2)
    out_prefix = tmp_path / "merged"
    code, out, _ = run(
        capsys,
        "merge",
        "--datasets",
        tmp_path / "p1",
        tmp_path / "p2",
        "--output-prefix",
        out_prefix,
    )
    assert code == 0 and "3 documents, 3 items, 8 tokens, uint16" in out
    merged = IndexedDatasetReader(out_prefix)
    assert list(merged.sizes) == [3, 1, 4]
    metadata = json.loads((tmp_path / "merged.merge.json").read_text())
    assert metadata["tool"] == "mds-index merge"
    assert metadata["inputs"] == [str((tmp_path / name).resolve()) for name in ("p1", "p2")]
    assert (metadata["num_documents"], metadata["num_tokens"]) == (3, 8)

    code, out, _ = run(capsys, "info", out_prefix)
    assert code == 0
    assert "documents: 3" in out and "tokens:    8" in out and "dtype:     uint16" in out
    assert "[      1,       2) 1 " in out and "[      2,       4) 1 " in out
    assert "[      4,       8) 1 " in out

    code, out, _ = run(capsys, "show", out_prefix, "--doc", 2)
    assert code == 0 and out.split() == [str(t) for t in merged[2]]


def test_show_sample_needs_build_then_matches_dataset(capsys, tmp_path, make_dataset):
    prefix = make_dataset(tmp_path / "d", np.full(30, 40), seed=3)
    common = ["--seq-length", 16, "--train-samples", 50, "--split", "100,0,0"]
    code, _, err = run(capsys, "show", prefix, "--sample", 4, *common)
    assert_one_line_error(code, err, "no complete sample-index cache", "mds-index build")
    assert run(capsys, "build", "--data-path", prefix, *common)[0] == 0
    code, out, _ = run(capsys, "show", prefix, "--sample", 4, *common)
    assert code == 0 and len(out.split()) == 17
    # Only the shown split's cache is needed: other splits' sample counts do not matter.
    other = ["--seq-length", 16, "--train-samples", 50, "--split", "90,10,0"]
    assert run(capsys, "build", "--data-path", prefix, *other, "--valid-samples", 9)[0] == 0
    code, out, err = run(capsys, "show", prefix, "--sample", 4, *other)
    assert code == 0 and len(out.split()) == 17, err


def test_show_prints_a_line_per_item_or_document_run(capsys, tmp_path, make_dataset):
    prefix = make_dataset(tmp_path / "d", [5, 7, 6], seed=4)
    reader = IndexedDatasetReader(prefix)
    code, out, _ = run(capsys, "show", prefix, "--doc", 1)
    assert code == 0 and out == " ".join(map(str, reader[1])) + "\n"
    # Sample 0 of L = 8 (9 tokens) crosses from one document into the next: two lines.
    common = ["--seq-length", 8, "--train-samples", 2, "--split", "100,0,0", "--seed", 1]
    assert run(capsys, "build", "--data-path", prefix, *common)[0] == 0
    code, out, err = run(capsys, "show", prefix, "--sample", 0, *common)
    assert code == 0, err
    lines = [[int(t) for t in line.split()] for line in out.splitlines()]
    assert sum(map(len, lines)) == 9 and len(lines) >= 2
    documents = [list(reader[i]) for i in range(3)]
    assert all(any(_contains(doc, line) for doc in documents) for line in lines)


def _contains(document: list[int], run: list[int]) -> bool:
    return any(document[i : i + len(run)] == run for i in range(len(document) - len(run) + 1))


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["info", "{tmp}/absent"], ["absent.idx: index file not found"]),
        (
            ["build", "--data-path", "{tmp}/absent", "--seq-length", "8", "--train-samples", "5"],
            ["absent.idx: index file not found"],
        ),
        (
            [
                "build",
                "--data-path",
                "{data}",
                "--seq-length",
                "8",
                "--train-samples",
                "5",
                "--split",
                "90,x",
            ],
            ["--split '90,x': 'x' is not a number"],
        ),
        (
            ["build", "--data-path", "zero", "{data}", "--seq-length", "8", "--train-samples", "5"],
            ["--data-path: weight 'zero' (value 1) is not a number"],
        ),
        (
            [
                "build",
                "--data-path",
                "0",
                "{data}",
                "0",
                "{data}",
                "--seq-length",
                "8",
                "--train-samples",
                "5",
            ],
            ["--data-path: the weights sum to 0"],
        ),
        (
            [
                "build",
                "--data-path",
                "{data}",
                "--seq-length",
                "8",
                "--train-samples",
                "5",
                "--valid-samples",
                "3",
                "--split",
                "100,0,0",
            ],
            ["leaves 0 of its 20 documents for valid, but 3 valid samples are requested"],
        ),
        (
            ["build", "--data-path", "{data}", "--seq-length", "8"],
            ["give exactly one of --train-samples or --train-iters"],
        ),
        (
            ["build", "--data-path", "{data}", "--seq-length", "0", "--train-samples", "5"],
            ["--seq-length must be >= 1"],
        ),
        (["show", "{data}", "--doc", "20"], ["--doc 20:", "has documents 0..19"]),
        (
            ["build", "--data-path", "-0.5", "{data}", "--seq-length", "8", "--train-samples", "5"],
            ["--data-path: weight '-0.5' must be finite and >= 0"],
        ),
        (
            ["merge", "--datasets", "{data}", "{data32}", "--output-prefix", "{tmp}/out"],
            ["token dtype int32 differs from uint16"],
        ),
        (
            ["build", "--data-path", "{data}", "--seq-length", "8", "--trian-samples", "5"],
            ["no such option: --trian-samples; did you mean --train-samples?"],
        ),
    ],
)
def test_user_mistakes_end_in_one_line(capsys, tmp_path, make_dataset, args, fragments):
    data = make_dataset(tmp_path / "data", [10] * 20)
    data32 = make_dataset(tmp_path / "data32", [10] * 2, dtype=np.int32)
    names = dict(tmp=tmp_path, data=data, data32=data32)
    code, _, err = run(capsys, *[a.format(**names) for a in args])
    assert_one_line_error(code, err, *fragments)
    assert code == (2 if "no such option" in fragments[0] else 1)
    assert not list(tmp_path.glob("out*")) and not list(tmp_path.glob("*.tmp*"))


def test_megatron_spellings_negative_weights_and_abbreviations(capsys, tmp_path, make_dataset):
    a = make_dataset(tmp_path / "a", [50] * 40, seed=1)
    b = make_dataset(tmp_path / "b", [70] * 40, seed=2)
    # --data-path W P W P (nargs='+'), abbreviated --seq (argparse), --train_samples (underscore)
    args = ["build", "--data-path", ".35", a, "0.65", b, "--split", "100,0,0", "--seq", 16]
    code, out, err = run(capsys, *args, "--train_samples", 200)
    assert code == 0, err
    assert "dataset 0, input: 0.35" in out
    code, _, err = run(capsys, "build", "--data-path", "-0.5", a, "--seq", 16, "--train", 5)
    assert code == 2 and err == (
        "mds-index build: error: ambiguous option: --train could match --train-iters, "
        "--train-samples\n"
    )


def test_console_script_runs(tmp_path, make_dataset):
    prefix = make_dataset(tmp_path / "d", [5, 6])
    result = subprocess.run(
        [sys.executable, "-m", "mds_indexed_data", "info", str(prefix)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and "tokens:    11" in result.stdout
    result = subprocess.run(
        [sys.executable, "-m", "mds_indexed_data", "info", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert (
        result.stderr
        == f"mds-index info: error: {Path(tmp_path / 'nope.idx')}: index file not found; "
        "pass the prefix without .bin/.idx\n"
    )


def test_build_takes_the_training_flags_cache_spelling(capsys, golden_prefix, tmp_path):
    """mds-index build's data flags are mds-train's (mds_indexed_data.flags.DataFlags): Megatron's
    --data-cache-path puts the caches where --cache-dir does (it was an unknown flag, exit 2)."""
    args = ["build", "--data-path", golden_prefix, "--seq-length", 64, "--train-samples", 10]
    code, _, err = run(capsys, *args, "--split", "100,0,0", "--data-cache-path", tmp_path)
    assert code == 0, err
    assert len(list(tmp_path.glob("*.npy"))) == 3
