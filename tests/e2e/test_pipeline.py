"""The README's pipeline through the real commands: learn a vocabulary, tokenize with it, build the
training sample indices, and read a training sample back as the text it came from."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from mds_indexed_data import IndexedDatasetReader

REPO_ROOT = Path(__file__).resolve().parents[2]


def run(*command: str, stdin: str | None = None) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False, input=stdin)
    assert result.returncode == 0, f"{command} failed:\n{result.stderr}"
    return result.stdout


def test_corpus_to_training_samples(tmp_path: Path):
    corpus = tmp_path / "corpus.jsonl"
    run(sys.executable, str(REPO_ROOT / "scripts" / "demo_corpus.py"), "--output", str(corpus))
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]

    run(
        "mds-tokenize",
        "learn",
        "--input",
        str(corpus),
        "--vocab-size",
        "1024",
        "--output-dir",
        str(tmp_path / "vocab"),
    )
    vocab_file, merge_file = tmp_path / "vocab" / "vocab.json", tmp_path / "vocab" / "merges.txt"
    vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
    assert len(vocab) == 1024

    # The Megatron spellings, as in the seeds' preprocessing scripts.
    run(
        "mds-tokenize",
        "--input",
        str(corpus),
        "--output-prefix",
        str(tmp_path / "demo"),
        "--vocab",
        str(vocab_file),
        "--merge-file",
        str(merge_file),
        "--tokenizer-type",
        "GPT2BPETokenizer",
        "--dataset-impl",
        "mmap",
        "--append-eod",
        "--workers",
        "2",
    )
    prefix = tmp_path / "demo_text_document"
    dataset = IndexedDatasetReader(prefix)
    eod = vocab["<|endoftext|>"]
    assert len(dataset) == len(texts)
    assert dataset.dtype == np.uint16
    assert all(
        dataset[i][-1] == eod and (dataset[i][:-1] != eod).all() for i in range(len(dataset))
    )
    assert max(int(dataset[i].max()) for i in range(len(dataset))) < len(vocab)

    # `mds-index show ... | mds-tokenize decode ...`: the packages meet only through the pipe.
    ids = run("mds-index", "show", str(prefix), "--doc", "3")
    decode = ("mds-tokenize", "decode", "--vocab-file", str(vocab_file), "--merge-file")
    assert run(*decode, str(merge_file), stdin=ids) == texts[3] + "<|endoftext|>\n"

    # `show --sample` must name the cache `build` made: the same index-determining flags.
    index_flags = (
        *("--split", "90,10,0", "--seq-length", "128", "--seed", "7"),
        *("--train-samples", "500", "--valid-samples", "20", "--test-samples", "0"),
    )
    summary = run("mds-index", "build", "--data-path", str(prefix), *index_flags)
    assert "train" in summary and "valid" in summary
    assert list(tmp_path.glob("demo_text_document_train_*doc_idx.npy"))
    sample = run("mds-index", "show", str(prefix), "--sample", "5", *index_flags)
    ids = [int(token) for token in sample.replace(",", " ").split() if token.isdigit()]
    assert len(ids) == 129
