"""A learned vocabulary in use: every training document encodes and decodes to itself with the
encoder's GPT2BPETokenizer, and `mds-tokenize` with the learned files writes a dataset that
`mds_indexed_data.IndexedDatasetReader` reads, with ids below the vocab size and the learned EOD."""

import json

import numpy as np
import pytest
from mds_indexed_data import IndexedDatasetReader
from mds_tokenize import cli
from mds_tokenize.byte_level import END_OF_TEXT
from mds_tokenize.tokenizer import GPT2BPETokenizer

VOCAB_SIZE = 3000


def run_cli(*args) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(arg) for arg in args])
    assert exit_info.value.code in (0, None)


@pytest.fixture(scope="module")
def learned(shared_data, tmp_path_factory):
    output = tmp_path_factory.mktemp("learned")
    run_cli(
        "learn",
        "--input",
        shared_data / "c4_demo.jsonl",
        "--vocab-size",
        VOCAB_SIZE,
        "--output-dir",
        output,
        "--workers",
        2,
    )
    return output


@pytest.fixture(scope="module")
def documents(shared_data):
    with open(shared_data / "c4_demo.jsonl", encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines]


def test_every_training_document_round_trips(learned, documents):
    tokenizer = GPT2BPETokenizer.from_files(learned / "vocab.json", learned / "merges.txt")
    assert tokenizer.vocab_size == VOCAB_SIZE and tokenizer.eod == VOCAB_SIZE - 1
    num_tokens = num_bytes = 0
    for text in documents:
        ids = tokenizer.encode(text)
        assert max(ids) < VOCAB_SIZE - 1  # the EOD never comes out of text
        assert tokenizer.decode(ids) == text
        num_tokens += len(ids)
        num_bytes += len(text.encode("utf-8"))
    # Merges really apply: a 3k vocabulary fitted to this English text gives > 3 bytes per token.
    assert num_bytes / num_tokens > 3


def test_round_trip_of_unseen_multilingual_text(learned):
    tokenizer = GPT2BPETokenizer.from_files(learned / "vocab.json", learned / "merges.txt")
    text = "Ünïcödé — 日本語 🙂\tand\r\n  odd   spacing\x00\x7f"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_encoder_writes_a_training_dataset_with_the_learned_files(
    learned, documents, shared_data, tmp_path
):
    prefix = tmp_path / "c4"
    run_cli(
        "--input",
        shared_data / "c4_demo.jsonl",
        "--output-prefix",
        prefix,
        "--vocab-file",
        learned / "vocab.json",
        "--merge-file",
        learned / "merges.txt",
        "--append-eod",
    )
    dataset = IndexedDatasetReader(f"{prefix}_text_document")
    assert dataset.dtype == np.uint16 and len(dataset) == len(documents) == dataset.num_documents
    tokenizer = GPT2BPETokenizer.from_files(learned / "vocab.json", learned / "merges.txt")
    eod = json.loads((learned / "vocab.json").read_text(encoding="utf-8"))[END_OF_TEXT]
    for index, text in enumerate(documents):
        item = dataset[index]
        assert int(item.max()) < VOCAB_SIZE
        assert item[-1] == eod and eod not in item[:-1]
        assert tokenizer.decode(item[:-1]) == text
