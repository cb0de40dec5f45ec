"""Loading vocab.json / merges.txt: Megatron's reading rules and one-line errors for bad files."""

import json
import logging

import pytest
from mds_tokenize import GPT2BPETokenizer, TokenizerFileError
from mds_tokenize.vocab_files import load_merges, load_vocab


def test_gpt2_files_load(shared_data):
    merges = load_merges(shared_data / "gpt2-merges.txt")
    assert len(merges) == 50000
    assert merges[0] == ("Ġ", "t") and merges[-1] == ("Ġg", "azed")
    assert len(load_vocab(shared_data / "gpt2-vocab.json")) == 50257
    assert len(load_merges(shared_data / "megatron-golden" / "gpt2-tiny-merges.txt")) == 4743


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"a": 0,', "vocab file is not valid JSON"),
        ("[1, 2]", "must be a non-empty JSON object"),
        ("{}", "must be a non-empty JSON object"),
        ('{"a": "0"}', "token 'a' has id '0'; ids must be non-negative integers"),
        ('{"a": -1}', "ids must be non-negative integers"),
        ('{"a": 1.0}', "ids must be non-negative integers"),
    ],
)
def test_malformed_vocab(tmp_path, content, message):
    path = tmp_path / "vocab.json"
    path.write_text(content)
    with pytest.raises(TokenizerFileError, match=message) as error:
        load_vocab(path)
    assert str(path) in str(error.value)


def test_missing_files(tmp_path, shared_data):
    with pytest.raises(
        TokenizerFileError, match="vocab file not found; pass an existing file with --vocab-file"
    ):
        GPT2BPETokenizer.from_files(tmp_path / "nope.json", shared_data / "gpt2-merges.txt")
    with pytest.raises(
        TokenizerFileError, match="merges file not found; pass an existing file with --merge-file"
    ):
        GPT2BPETokenizer.from_files(shared_data / "gpt2-vocab.json", tmp_path / "nope.txt")


def test_not_utf8(tmp_path):
    path = tmp_path / "merges.txt"
    path.write_bytes(b"#version: 0.2\n\xff \xfe\n")
    with pytest.raises(TokenizerFileError, match="merges file is not UTF-8"):
        load_merges(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "merges file is empty"),
        (
            "#version: 0.2\na b\nabc\n",
            r"merges.txt:3: expected two space-separated symbols, got 'abc'",
        ),
        ("#version: 0.2\na b c\n", r"merges.txt:2: expected two space-separated symbols"),
    ],
)
def test_malformed_merges(tmp_path, content, message):
    path = tmp_path / "merges.txt"
    path.write_text(content)
    with pytest.raises(TokenizerFileError, match=message):
        load_merges(path)


def test_merges_reading_rules(tmp_path, caplog):
    path = tmp_path / "merges.txt"
    path.write_text("#version: 0.2\na b\n\nab c\n")
    with caplog.at_level(logging.WARNING):
        assert load_merges(path) == [("a", "b"), ("ab", "c")]
    assert not caplog.records  # a header and a final newline: nothing to warn about


def test_missing_final_newline_keeps_last_merge_and_warns(tmp_path, caplog):
    path = tmp_path / "merges.txt"
    path.write_text("#version: 0.2\na b\nab c")
    with caplog.at_level(logging.WARNING):
        assert load_merges(path) == [("a", "b"), ("ab", "c")]
    assert "no newline after the last line 'ab c'; Megatron would drop that merge" in caplog.text


def test_missing_header_keeps_first_merge_and_warns(tmp_path, caplog):
    path = tmp_path / "merges.txt"
    path.write_text("a b\nab c\n")
    with caplog.at_level(logging.WARNING):
        assert load_merges(path) == [("a", "b"), ("ab", "c")]
    assert "is not a '#version' header; Megatron drops the first line" in caplog.text


def test_crlf_merges_file(tmp_path, shared_data):
    path = tmp_path / "merges.txt"
    path.write_bytes((shared_data / "gpt2-merges.txt").read_bytes().replace(b"\n", b"\r\n"))
    assert load_merges(path) == load_merges(shared_data / "gpt2-merges.txt")


def test_vocab_missing_a_byte_symbol_is_refused(tmp_path, shared_data):
    golden = shared_data / "megatron-golden"
    vocab = json.loads((golden / "gpt2-tiny-vocab.json").read_text(encoding="utf-8"))
    del vocab["\u0100"]  # byte 0x00's symbol
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(
        TokenizerFileError,
        match=f"^{path}: 1 of the 256 byte symbols are not in the vocabulary \\(e.g. 'Ā'\\)",
    ):
        GPT2BPETokenizer.from_files(path, golden / "gpt2-tiny-merges.txt")
