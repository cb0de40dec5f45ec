"""`--tokenizer-type PretrainedFromHF`: GPT-2's files as a Hugging Face tokenizer.json give our
GPT-2 ids and Megatron's golden files byte for byte; a WordPiece tokenizer of 70,000 entries (int32)
round-trips through the whole command, with any worker count and partitioning; `learn
--tokenizer-json` writes a tokenizer.json that `tokenizers` encodes identically."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from mds_common.tokenizer_record import TokenizerRecord
from mds_indexed_data import IndexedDatasetReader
from mds_tokenize import load_tokenizer, spec_from_record
from mds_tokenize.cli import main
from mds_tokenize.config import TokenizeConfig
from mds_tokenize.pipeline import run
from tokenizers import Tokenizer

HF = ("--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path")


def cli(*args) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main([str(arg) for arg in args])
    return exit_info.value.code


def dataset_bytes(prefix) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def sidecar(prefix) -> dict:
    return json.loads(Path(f"{prefix}.tokenize.json").read_text())


def test_gpt2_as_tokenizer_json_gives_our_gpt2_ids(hf_gpt2_dir, gpt2_tokenizer, corpus_texts):
    hf = load_tokenizer(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(hf_gpt2_dir))
    hf_ids = (hf.vocab_size, hf.eod)
    assert hf_ids == (50257, 50256)  # <|endoftext|>, found by its spelling
    for name, texts in corpus_texts.items():
        ids, lengths = hf.encode_batch(texts, append_eod=True)
        expected_ids, expected_lengths = gpt2_tokenizer.encode_batch(texts, append_eod=True)
        assert lengths.tolist() == expected_lengths.tolist(), name
        assert np.array_equal(ids, expected_ids), name
    text = "Hello world! <|endoftext|> It's 2024."
    assert hf.encode(text) == gpt2_tokenizer.encode(text)
    assert hf.decode(hf.encode(text)) == text
    with pytest.raises(ValueError, match=r"token id 50257 is not in the vocabulary \(ids 0..50256"):
        hf.decode([15496, 50257])
    gpt2 = gpt2_tokenizer.record()
    assert gpt2.type == "GPT2BPETokenizer" and (gpt2.vocab_size, gpt2.eod_id) == hf_ids
    assert load_tokenizer(spec_from_record(gpt2)).record() == gpt2


def test_gpt2_tokenizer_json_reproduces_megatron_golden_files(shared_data, tmp_path, hf_tiny_dir):
    golden = shared_data / "megatron-golden"
    # bigscience's command line, with the tokenizer flags of its PretrainedFromHF runs.
    code = cli(
        *("--input", shared_data / "openwebtext-1000.jsonl"),
        *("--output-prefix", tmp_path / "meg-gpt2-openwebtext"),
        *("--dataset-impl", "mmap", *HF, hf_tiny_dir, "--append-eod", "--workers", 2),
    )
    assert code == 0
    prefix = tmp_path / "meg-gpt2-openwebtext_text_document"
    assert dataset_bytes(prefix) == dataset_bytes(golden / "meg-gpt2-openwebtext_text_document")
    metadata = sidecar(prefix)
    tokenizer_file = str((hf_tiny_dir / "tokenizer.json").resolve())
    assert metadata["inputs"][1:] == [tokenizer_file]
    assert metadata["vocabulary"] == {
        "type": "PretrainedFromHF",
        "name_or_path": str(hf_tiny_dir),
        "tokenizer_file": tokenizer_file,
        "tokenizer_sha256": metadata["vocabulary"]["tokenizer_sha256"],
        "vocab_size": 5000,
        "eod_id": 4999,
        "eod_token": "<|endoftext|>",
    }
    assert metadata["dtype"] == "uint16" and metadata["num_tokens"] == 1361845
    # The recorded description reloads the same tokenizer (what mds-generate does from meta.json).
    reloaded = load_tokenizer(spec_from_record(TokenizerRecord.from_json(metadata["vocabulary"])))
    assert reloaded.record().to_json() == {**metadata["vocabulary"], "name_or_path": tokenizer_file}


def test_wordpiece_past_uint16_round_trips_as_int32(shared_data, tmp_path, wordpiece_dir):
    reference = Tokenizer.from_file(str(wordpiece_dir / "tokenizer.json"))
    sep = reference.token_to_id("[SEP]")
    corpus = shared_data / "c4_demo.jsonl"
    args = ("--input", corpus, *HF, wordpiece_dir, "--eod-token", "[SEP]", "--append-eod")
    assert cli(*args, "--output-prefix", tmp_path / "w2", "--workers", 2) == 0
    reader = IndexedDatasetReader(tmp_path / "w2_text_document")
    assert reader.dtype == np.int32 and sidecar(tmp_path / "w2_text_document")["dtype"] == "int32"
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]
    assert len(reader) == len(texts)
    largest = 0
    for index, text in enumerate(texts):
        expected = reference.encode(text).ids + [sep]  # `<s> ...` from the post-processor, EOD
        assert reader[index].tolist() == expected, index
        largest = max(largest, max(expected))
    assert largest > 65535  # ids that only int32 holds are really written
    vocabulary = sidecar(tmp_path / "w2_text_document")["vocabulary"]
    assert (vocabulary["vocab_size"], vocabulary["eod_id"]) == (70000, sep)
    assert vocabulary["eod_token"] == "[SEP]"

    # One worker, and two partitions merged, give the same bytes.
    summary = run(
        TokenizeConfig(
            input=corpus,
            output_prefix=str(tmp_path / "w1"),
            tokenizer_type="PretrainedFromHF",
            tokenizer_name_or_path=str(wordpiece_dir),
            eod_token="[SEP]",
            append_eod=True,
            block_bytes=100_000,
        )
    )
    assert summary.num_docs == len(texts)
    expected_bytes = dataset_bytes(tmp_path / "w2_text_document")
    assert dataset_bytes(tmp_path / "w1_text_document") == expected_bytes
    for part in ("0/2", "1/2"):
        assert cli(*args, "--output-prefix", tmp_path / "p", "--partition", part) == 0
    assert cli("merge", "--output-prefix", tmp_path / "p") == 0
    assert dataset_bytes(tmp_path / "p_text_document") == expected_bytes


def test_eos_token_of_tokenizer_config_and_the_file_itself(tmp_path, wordpiece_dir):
    folder = tmp_path / "saved"
    folder.mkdir()
    shutil.copy(wordpiece_dir / "tokenizer.json", folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "[SEP]"}}))
    tokenizer = load_tokenizer(
        tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(folder / "tokenizer.json")
    )
    assert tokenizer.eod == tokenizer.encode("[SEP]")[1]  # after the BOS
    assert tokenizer.files == (folder / "tokenizer.json", folder / "tokenizer_config.json")
    # --eod-token wins over the configured eos token.
    flagged = load_tokenizer(
        tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(folder), eod_token="<s>"
    )
    assert flagged.eod == flagged.encode("")[0]


def test_decode_command_reads_a_tokenizer_json(hf_gpt2_dir, capsys):
    assert cli("decode", *HF, hf_gpt2_dir, "15496", "995", "0", "50256") == 0
    assert capsys.readouterr().out == "Hello world!<|endoftext|>\n"


def test_learn_writes_a_tokenizer_json_that_encodes_identically(
    shared_data, tmp_path, corpus_texts, adversarial_texts
):
    from mds_tokenize import GPT2BPETokenizer

    output = tmp_path / "vocab"
    code = cli(
        *("learn", "--input", shared_data / "c4_demo.jsonl", "--vocab-size", 3000),
        *("--output-dir", output, "--workers", 1, "--tokenizer-json"),
    )
    assert code == 0
    assert sorted(path.name for path in output.iterdir()) == [
        "learn-config.json",
        "merges.txt",
        "tokenizer.json",
        "vocab.json",
    ]
    ours = GPT2BPETokenizer.from_files(output / "vocab.json", output / "merges.txt")
    theirs = Tokenizer.from_file(str(output / "tokenizer.json"))
    assert theirs.get_vocab() == ours.vocab
    for text in corpus_texts["c4_demo.jsonl"] + adversarial_texts:
        ids = ours.encode(text)
        assert theirs.encode(text).ids == ids, repr(text[:200])
        assert theirs.decode(ids, skip_special_tokens=False) == ours.decode(ids)
    # Through our interface too, EOD included.
    loaded = load_tokenizer(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(output))
    assert (loaded.eod, loaded.vocab_size) == (ours.eod, ours.vocab_size) == (2999, 3000)
