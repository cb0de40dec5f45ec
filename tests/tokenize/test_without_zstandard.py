"""mds-tokenize where zstandard is not installed (the GPU machine's image): the package imports and
encodes plain jsonl; only a `.zst` input needs zstandard, and is then refused with one line naming
the file and the package to install (issue #24). zstandard is made unimportable in a subprocess
(`sys.modules['zstandard'] = None` makes `import zstandard` raise ImportError)."""

import json
import subprocess
import sys
from pathlib import Path

WITHOUT_ZSTANDARD = """
import sys
sys.modules["zstandard"] = None
import mds_tokenize
from mds_tokenize import pipeline  # the encoder's modules, input_reader among them
from mds_tokenize.cli import main
main(sys.argv[1:])
"""


def run_without_zstandard(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_ZSTANDARD, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_corpus(path: Path) -> None:
    path.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(5)))


def test_plain_jsonl_encodes_without_zstandard(gpt2_args, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus)
    result = run_without_zstandard(
        "--input", corpus, "--output-prefix", tmp_path / "out", *gpt2_args
    )
    assert result.returncode == 0, result.stderr
    metadata = json.loads((tmp_path / "out_text_document.tokenize.json").read_text())
    assert metadata["num_documents"] == 5


def assert_zstandard_refusal(result: subprocess.CompletedProcess, prefix: str, path: Path) -> None:
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prefix}: error: {path}: a .zst input needs the zstandard "), lines
    assert "pip install zstandard" in lines[0], lines[0]


def test_zst_input_without_zstandard_is_one_line(gpt2_args, tmp_path):
    # The bytes are never read: the refusal comes before the file is opened.
    corpus = tmp_path / "corpus.jsonl.zst"
    corpus.write_bytes(b"not read")
    output = tmp_path / "out"
    output.mkdir()
    result = run_without_zstandard(
        "--input", corpus, "--output-prefix", output / "data", *gpt2_args
    )
    assert_zstandard_refusal(result, "mds-tokenize", corpus)
    assert list(output.iterdir()) == []


def test_zst_input_without_zstandard_is_one_line_for_learn(tmp_path):
    corpus = tmp_path / "corpus.jsonl.zst"
    corpus.write_bytes(b"not read")
    output = tmp_path / "vocab"
    result = run_without_zstandard(
        "learn", "--input", corpus, "--vocab-size", 300, "--output-dir", output
    )
    assert_zstandard_refusal(result, "mds-tokenize learn", corpus)
    assert not output.exists() or list(output.iterdir()) == []
