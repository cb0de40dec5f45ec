"""`mds-tokenize learn` as a command: GPT-2-format files, invariance to workers and compression, and
one clear stderr line (exit 1, nothing written) for each user mistake."""

import gzip
import io
import json
import lzma
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
import zstandard
from mds_tokenize.byte_level import END_OF_TEXT
from mds_tokenize.cli import main
from mds_tokenize.learn import counting as learn_counting


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def invoke(*args) -> Result:
    """`mds-tokenize learn ARGS` in this process, through the real entry point."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        try:
            main(["learn", *map(str, args)])
        except SystemExit as exit_:
            code = exit_.code
    return Result(code, stdout.getvalue(), stderr.getvalue())


def write_jsonl(path: Path, texts) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    return path


def test_writes_gpt2_format_vocabulary(shared_data, tmp_path):
    output = tmp_path / "vocab"
    result = invoke(
        "--input",
        shared_data / "c4_demo.jsonl",
        "--vocab-size",
        2048,
        "--output-dir",
        output,
        "--workers",
        1,
    )
    assert result.exit_code == 0, result.output
    assert sorted(path.name for path in output.iterdir()) == [
        "learn-config.json",
        "merges.txt",
        "vocab.json",
    ]
    vocab = json.loads((output / "vocab.json").read_text(encoding="utf-8"))
    assert sorted(vocab.values()) == list(range(2048))
    assert vocab[END_OF_TEXT] == 2047
    merges_text = (output / "merges.txt").read_text(encoding="utf-8")
    lines = merges_text.split("\n")
    assert lines[0] == "#version: 0.2" and lines[-1] == ""  # Megatron drops both
    merges = [line.split(" ") for line in lines[1:-1]]
    assert len(merges) == 2048 - 257 and all(len(pair) == 2 for pair in merges)
    assert [vocab[left + right] for left, right in merges] == list(range(256, 2047))
    # Same file layout as GPT-2's own encoder.json: json.dumps with ASCII escapes.
    assert (output / "vocab.json").read_text(encoding="utf-8") == json.dumps(vocab)
    summary = json.loads((output / "learn-config.json").read_text(encoding="utf-8"))
    assert summary["tool"] == "mds-tokenize learn" and summary["eod_id"] == 2047
    assert summary["num_documents"] == 300 and summary["config"]["vocab_size"] == 2048
    assert summary["config"]["inputs"] == [str((shared_data / "c4_demo.jsonl").resolve())]


def test_workers_and_compression_do_not_change_the_result(shared_data, tmp_path, monkeypatch):
    monkeypatch.setattr(learn_counting, "BLOCK_BYTES", 1 << 16)  # many blocks per worker
    lines = (shared_data / "c4_demo.jsonl").read_bytes().splitlines(keepends=True)
    parts = [tmp_path / "part0.jsonl.gz", tmp_path / "part1.jsonl.xz", tmp_path / "part2.jsonl.zst"]
    parts[0].write_bytes(gzip.compress(b"".join(lines[:100])))
    parts[1].write_bytes(lzma.compress(b"".join(lines[100:200])))
    parts[2].write_bytes(zstandard.ZstdCompressor().compress(b"".join(lines[200:])))
    plain = invoke(
        "--input",
        shared_data / "c4_demo.jsonl",
        "--vocab-size",
        1500,
        "--output-dir",
        tmp_path / "plain",
        "--workers",
        1,
    )
    split = invoke(
        *[arg for part in parts for arg in ("--input", part)],
        "--vocab-size",
        1500,
        "--output-dir",
        tmp_path / "split",
        "--workers",
        2,
    )
    assert plain.exit_code == 0 and split.exit_code == 0, plain.output + split.output
    for name in ("vocab.json", "merges.txt"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "split" / name).read_bytes()


def test_extra_special_tokens_come_before_the_appended_eod(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["hello world, hello there"] * 3)
    result = invoke(
        "--input",
        corpus,
        "--vocab-size",
        270,
        "--output-dir",
        tmp_path / "out",
        "--special-tokens",
        "<pad>",
        "--special-tokens",
        "<mask>",
        "--min-frequency",
        1,
    )
    assert result.exit_code == 0, result.output
    vocab = json.loads((tmp_path / "out" / "vocab.json").read_text(encoding="utf-8"))
    assert [vocab["<pad>"], vocab["<mask>"], vocab[END_OF_TEXT]] == [267, 268, 269]


def test_corpus_too_small_for_the_vocabulary_writes_what_it_supports(tmp_path, caplog):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["abc abc"])
    result = invoke("--input", corpus, "--vocab-size", 1000, "--output-dir", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "the corpus supports only 259 tokens" in caplog.text
    vocab = json.loads((tmp_path / "out" / "vocab.json").read_text(encoding="utf-8"))
    # Words "abc" and "Ġabc" once each: only "a b" and "ab c" occur --min-frequency 2 times.
    assert len(vocab) == 259 and vocab["ab"] == 256 and vocab["abc"] == 257


def assert_user_error(result, message: str, output_dir: Path):
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mds-tokenize learn: error: "), result.stderr
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert not (output_dir / "vocab.json").exists() and not (output_dir / "merges.txt").exists()


@pytest.mark.parametrize(
    ("vocab_size", "specials", "message"),
    [
        (
            256,
            [],
            "--vocab-size 256 is too small: the 256 byte tokens and 1 special token(s) need at "
            "least 257",
        ),
        (258, ["<pad>", "<mask>"], "--vocab-size 258 is too small"),
        (300, ["<pad>", "<pad>"], "--special-tokens lists '<pad>' twice"),
    ],
)
def test_bad_vocabulary_options(tmp_path, vocab_size, specials, message):
    corpus = write_jsonl(tmp_path / "c.jsonl", ["text"])
    extra = [arg for token in specials for arg in ("--special-tokens", token)]
    result = invoke(
        "--input", corpus, "--vocab-size", vocab_size, "--output-dir", tmp_path / "out", *extra
    )
    assert_user_error(result, message, tmp_path / "out")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "no text found under --json-keys text (0 documents); pass a non-empty corpus"),
        (b'{"text": ""}\n\n{"text": ""}\n', "no text found under --json-keys text (2 documents)"),
        (b'{"text": "ok"}\n{"text": "ok"}\n{"text": broken}\n', "bad.jsonl:3: not valid JSON"),
        (b'{"text": "ok"}\n{"body": "no text key"}\n', "bad.jsonl:2: missing key 'text'"),
        (b'{"text": 5}\n', "bad.jsonl:1: value of 'text' is a number, expected a string"),
        (b'{"text": "\\udc80"}\n', "bad.jsonl:1: value of 'text' holds a lone surrogate"),
    ],
)
@pytest.mark.parametrize("workers", [1, 2])
def test_bad_corpus(tmp_path, monkeypatch, content, message, workers):
    # Tiny blocks, so that two workers really split these few lines between them.
    monkeypatch.setattr(learn_counting, "BLOCK_BYTES", 16)
    corpus = tmp_path / "bad.jsonl"
    corpus.write_bytes(content)
    result = invoke(
        "--input",
        corpus,
        "--vocab-size",
        300,
        "--output-dir",
        tmp_path / "out",
        "--workers",
        workers,
    )
    assert_user_error(result, message, tmp_path / "out")


def test_missing_input_and_unreadable_compressed_input(tmp_path):
    result = invoke(
        "--input", tmp_path / "nope.jsonl", "--vocab-size", 300, "--output-dir", tmp_path / "out"
    )
    assert_user_error(
        result, "--input " + str(tmp_path / "nope.jsonl") + ": no such file", tmp_path / "out"
    )
    corrupt = tmp_path / "corrupt.jsonl.gz"
    corrupt.write_bytes(gzip.compress(b'{"text": "hello"}\n' * 100)[:40])
    result = invoke("--input", corrupt, "--vocab-size", 300, "--output-dir", tmp_path / "out")
    assert_user_error(result, "corrupt.jsonl.gz: cannot decompress", tmp_path / "out")


def test_failure_keeps_an_earlier_vocabulary_intact(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", ["hello hello world"] * 4)
    assert (
        invoke("--input", good, "--vocab-size", 260, "--output-dir", tmp_path / "out").exit_code
        == 0
    )
    before = {path.name: path.read_bytes() for path in (tmp_path / "out").iterdir()}
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"text": "ok"}\nnot json\n')
    result = invoke("--input", bad, "--vocab-size", 260, "--output-dir", tmp_path / "out")
    assert result.exit_code == 1 and "bad.jsonl:2: not valid JSON" in result.stderr
    assert {path.name: path.read_bytes() for path in (tmp_path / "out").iterdir()} == before
