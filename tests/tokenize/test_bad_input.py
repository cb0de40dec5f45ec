"""Bad input that once passed silently, run through the installed command: a truncated `.zst`
corpus (encode and learn) and a vocab.json / merges.txt pair that do not belong together. Each ends
with one stderr line naming the file, exit 1, and nothing written."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

NUM_DOCUMENTS = 10


def run_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mds_tokenize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, prefix: str, message: str) -> str:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prefix}: error: "), lines[0]
    assert message in lines[0], lines[0]
    return lines[0]


def zstd_documents() -> tuple[bytes, list[int]]:
    """Ten documents, one zstd block each, in one frame; and the byte offset where each block ends
    (a cut there leaves a stream of whole blocks that only lacks its end)."""
    compressed = io.BytesIO()
    writer = zstandard.ZstdCompressor().stream_writer(compressed, closefd=False)
    block_ends = []
    for index in range(NUM_DOCUMENTS):
        text = f"document {index}: " + " ".join(str(word * index) for word in range(300))
        writer.write((json.dumps({"text": text}) + "\n").encode())
        writer.flush(zstandard.FLUSH_BLOCK)
        block_ends.append(len(compressed.getvalue()))
    writer.flush(zstandard.FLUSH_FRAME)
    return compressed.getvalue(), block_ends


@pytest.fixture
def truncated_zst(request, tmp_path) -> Path:
    data, block_ends = zstd_documents()
    cut = {"at-block-end": block_ends[3], "mid-block": (block_ends[3] + block_ends[4]) // 2}
    path = tmp_path / "in" / "corpus.jsonl.zst"
    path.parent.mkdir()
    path.write_bytes(data[: cut[request.param]])
    return path


def test_complete_zst_keeps_every_document(gpt2_args, tmp_path):
    path = tmp_path / "corpus.jsonl.zst"
    path.write_bytes(zstd_documents()[0])
    result = run_command("--input", path, "--output-prefix", tmp_path / "out", *gpt2_args)
    assert result.returncode == 0, result.stderr
    metadata = json.loads((tmp_path / "out_text_document.tokenize.json").read_text())
    assert metadata["num_documents"] == NUM_DOCUMENTS


@pytest.mark.parametrize("truncated_zst", ["at-block-end", "mid-block"], indirect=True)
@pytest.mark.parametrize("skip_bad_lines", [[], ["--skip-bad-lines"]])
def test_truncated_zst_is_refused_by_encode(gpt2_args, tmp_path, truncated_zst, skip_bad_lines):
    output = tmp_path / "out"
    output.mkdir()
    result = run_command(
        "--input",
        truncated_zst,
        "--output-prefix",
        output / "data",
        *gpt2_args,
        "--workers",
        2,
        *skip_bad_lines,
    )
    line = assert_one_line_error(result, "mds-tokenize", f"{truncated_zst}: cannot decompress")
    assert "the file ends inside a zstd frame" in line and "truncated" in line
    assert list(output.iterdir()) == []


@pytest.mark.parametrize("truncated_zst", ["at-block-end", "mid-block"], indirect=True)
def test_truncated_zst_is_refused_by_learn(tmp_path, truncated_zst):
    output = tmp_path / "vocab"
    result = run_command(
        "learn", "--input", truncated_zst, "--vocab-size", 300, "--output-dir", output
    )
    line = assert_one_line_error(
        result, "mds-tokenize learn", f"{truncated_zst}: cannot decompress"
    )
    assert "the file ends inside a zstd frame" in line
    assert not output.exists() or list(output.iterdir()) == []


@pytest.fixture(scope="module")
def learned_vocab(shared_data, tmp_path_factory) -> Path:
    """A 300-token vocabulary learned from the first 200 documents of the c4 demo corpus."""
    folder = tmp_path_factory.mktemp("learned")
    corpus = folder / "corpus.jsonl"
    lines = (shared_data / "c4_demo.jsonl").read_bytes().splitlines(keepends=True)
    corpus.write_bytes(b"".join(lines[:200]))
    result = run_command(
        "learn", "--input", corpus, "--vocab-size", 300, "--output-dir", folder / "vocab"
    )
    assert result.returncode == 0, result.stderr
    return folder / "vocab"


def test_learned_pair_tokenizes(shared_data, tmp_path, learned_vocab):
    result = run_command(
        "--input",
        shared_data / "c4_demo.jsonl",
        "--output-prefix",
        tmp_path / "out",
        "--vocab-file",
        learned_vocab / "vocab.json",
        "--merge-file",
        learned_vocab / "merges.txt",
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("pairing", "message"),
    [
        (
            "learned vocab, GPT-2 merges",
            "merges make a token the vocabulary lacks (the first, rank ",
        ),
        (
            "GPT-2 vocab, learned merges",
            "of the vocabulary's 50,257 tokens (e.g. ",
        ),
    ],
)
def test_vocab_and_merges_that_do_not_belong_together(
    shared_data, tmp_path, learned_vocab, pairing, message
):
    if pairing.startswith("learned vocab"):
        vocab, merges = learned_vocab / "vocab.json", shared_data / "gpt2-merges.txt"
    else:
        vocab, merges = shared_data / "gpt2-vocab.json", learned_vocab / "merges.txt"
    output = tmp_path / "out"
    output.mkdir()
    result = run_command(
        "--input",
        shared_data / "c4_demo.jsonl",
        "--output-prefix",
        output / "data",
        "--vocab-file",
        vocab,
        "--merge-file",
        merges,
    )
    line = assert_one_line_error(
        result, "mds-tokenize", f"{vocab} and {merges} do not belong together: "
    )
    assert message in line
    assert line.endswith(
        "pass the vocab.json and merges.txt written together (GPT-2's pair, or one learn run)"
    )
    assert list(output.iterdir()) == []


def test_mds_index_merge_refuses_datasets_of_different_vocabularies(
    shared_data, tmp_path, learned_vocab
):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b"".join((shared_data / "c4_demo.jsonl").read_bytes().splitlines(True)[:20]))
    pairs = {
        "gpt2": (shared_data / "gpt2-vocab.json", shared_data / "gpt2-merges.txt"),
        "learned": (learned_vocab / "vocab.json", learned_vocab / "merges.txt"),
    }
    for name, (vocab, merges) in pairs.items():
        result = run_command(
            "--input", corpus, "--output-prefix", tmp_path / name,
            "--vocab-file", vocab, "--merge-file", merges,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    gpt2, learned = tmp_path / "gpt2_text_document", tmp_path / "learned_text_document"
    result = subprocess.run(
        [sys.executable, "-m", "mds_indexed_data", "merge", "--datasets", str(gpt2), str(learned),
         "--output-prefix", str(tmp_path / "merged")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0], result.stderr
    # The sidecar records each vocabulary file resolved (../shared may be reached through a link).
    recorded = {name: [path.resolve() for path in pair] for name, pair in pairs.items()}
    assert (
        f"{learned} was tokenized with {recorded['learned'][0]} + {recorded['learned'][1]}, "
        f"{gpt2} with {recorded['gpt2'][0]} + {recorded['gpt2'][1]}: their token ids mean "
        "different things"
    ) in lines[0]
    assert not list(tmp_path.glob("merged*"))
