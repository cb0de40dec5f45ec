"""The mistakes a user of `--tokenizer-type PretrainedFromHF` will make, through the installed
command: each ends with one stderr line saying what to do, a non-zero exit and nothing written."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mds_tokenize import check_dataset_tokenizer, load_tokenizer

HF = ("--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path")


def run_command(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mds_tokenize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "in" / "corpus.jsonl"
    path.parent.mkdir()
    path.write_text('{"text": "Hello world"}\n{"text": "again"}\n')
    return path


def one_error_line(result: subprocess.CompletedProcess, *, exit_code: int = 1) -> str:
    assert result.returncode == exit_code, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("mds-tokenize: error: "), lines[0]
    return lines[0][len("mds-tokenize: error: ") :]


def encode_with(corpus: Path, *tokenizer_args, env=None) -> subprocess.CompletedProcess:
    output = corpus.parent.parent / "out"
    output.mkdir()
    result = run_command(
        "--input",
        corpus,
        "--output-prefix",
        output / "data",
        "--append-eod",
        *tokenizer_args,
        env=env,
    )
    assert list(output.iterdir()) == []  # nothing written, not even a sidecar
    return result


def test_folder_without_tokenizer_json(corpus, tmp_path):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "vocab.txt").write_text("[UNK]\n")
    message = one_error_line(encode_with(corpus, *HF, folder))
    assert message == (
        f"--tokenizer-name-or-path {folder}: no tokenizer.json in this folder (it holds "
        "vocab.txt); pass a folder holding a Hugging Face tokenizer.json or the file itself "
        "(transformers writes one: AutoTokenizer.from_pretrained(NAME).save_pretrained(FOLDER))"
    )


def test_hub_name_without_network(corpus, tmp_path):
    # Offline with an empty cache: what a compute node without internet access sees.
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    message = one_error_line(encode_with(corpus, *HF, "bigscience/bloom-560m", env=env))
    assert message.startswith(
        "--tokenizer-name-or-path bigscience/bloom-560m: no such folder or file, and the Hugging "
        "Face hub did not provide it ("
    )
    assert message.endswith(
        "); check the name and the network, or pass a local folder holding tokenizer.json"
    )


def test_hub_name_without_transformers(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` fails
    with pytest.raises(ValueError) as error:
        load_tokenizer(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path="t5-small")
    assert str(error.value) == (
        "--tokenizer-name-or-path t5-small: no such folder or file, and a hub name needs "
        "transformers (pip install transformers) and the network; or pass a local folder holding "
        "tokenizer.json (e.g. `hf download t5-small tokenizer.json --local-dir DIR`)"
    )


def test_without_the_tokenizers_library(monkeypatch, wordpiece_dir):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ValueError, match=r"pip install 'mds-tokenize\[hf\]'$"):
        load_tokenizer(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=wordpiece_dir)


def test_no_end_of_text_token_and_no_flag(corpus, wordpiece_dir):
    message = one_error_line(encode_with(corpus, *HF, wordpiece_dir))
    assert message == (
        f"--append-eod: {(wordpiece_dir / 'tokenizer.json').resolve()} has no end-of-text token "
        "(no eos_token in tokenizer_config.json, none of <|endoftext|>, </s>, <|end_of_text|>, "
        "<eos>); name the token that ends documents with --eod-token TOKEN"
    )


def test_eod_token_that_is_not_a_token(corpus, wordpiece_dir):
    message = one_error_line(encode_with(corpus, *HF, wordpiece_dir, "--eod-token", "</s>"))
    assert message == (
        f"--eod-token '</s>': not a token of {(wordpiece_dir / 'tokenizer.json').resolve()}; "
        "name one of its tokens (its end-of-text or eos token)"
    )


def test_unreadable_tokenizer_json(corpus, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text('{"version": "1.0"}')
    message = one_error_line(encode_with(corpus, *HF, path))
    assert message.startswith(f"{path}: not a tokenizer.json the tokenizers library can read (")
    assert message.endswith("); pass a Hugging Face tokenizer.json with --tokenizer-name-or-path")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--tokenizer-type", "PretrainedFromHF"),
            "Missing option '--tokenizer-name-or-path': --tokenizer-type PretrainedFromHF needs a "
            "folder holding tokenizer.json, the file itself, or a hub name",
        ),
        (
            ("--tokenizer-name-or-path", "gpt2"),
            "--tokenizer-name-or-path is for --tokenizer-type PretrainedFromHF, not "
            "GPT2BPETokenizer; add --tokenizer-type PretrainedFromHF to use a Hugging Face "
            "tokenizer",
        ),
        (
            ("--tokenizer-type", "BertWordPieceLowerCase"),
            "--tokenizer-type BertWordPieceLowerCase: choose GPT2BPETokenizer (--vocab-file, "
            "--merge-file), PretrainedFromHF (--tokenizer-name-or-path: any Hugging Face "
            "tokenizer.json, BERT WordPiece and SentencePiece ones included), or "
            "SentencePieceTokenizer, GPTSentencePieceTokenizer, HFTokenizer (--tokenizer-model)",
        ),
    ],
)
def test_tokenizer_flags_that_do_not_fit_are_usage_errors(corpus, args, message):
    assert one_error_line(encode_with(corpus, *args), exit_code=2) == message


def test_dataset_of_another_tokenizer_is_named(shared_data, tmp_path, corpus, hf_gpt2_dir):
    prefix = tmp_path / "out" / "data"
    result = run_command("--input", corpus, "--output-prefix", prefix, *HF, hf_gpt2_dir)
    assert result.returncode == 0, result.stderr
    dataset = f"{prefix}_text_document"
    hf = load_tokenizer(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(hf_gpt2_dir))
    check_dataset_tokenizer(dataset, hf.record())  # the same tokenizer: no complaint
    gpt2 = load_tokenizer(
        vocab_file=shared_data / "gpt2-vocab.json", merge_file=shared_data / "gpt2-merges.txt"
    )
    with pytest.raises(ValueError) as error:
        check_dataset_tokenizer(dataset, gpt2.record())
    tokenizer_file = (hf_gpt2_dir / "tokenizer.json").resolve()
    assert str(error.value) == (
        f"{dataset} was tokenized with PretrainedFromHF {tokenizer_file}, but the tokenizer flags "
        f"name {(shared_data / 'gpt2-vocab.json').resolve()} + "
        f"{(shared_data / 'gpt2-merges.txt').resolve()}: token ids mean different things; pass "
        "the tokenizer it was made with (its .tokenize.json records it) or re-tokenize it"
    )
    # mds-index merge refuses to join it with a GPT-2 dataset, in one line naming both.
    gpt2_prefix = tmp_path / "out" / "gpt2"
    result = run_command(
        "--input", corpus, "--output-prefix", gpt2_prefix,
        "--vocab-file", shared_data / "gpt2-vocab.json",
        "--merge-file", shared_data / "gpt2-merges.txt",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    merged = subprocess.run(
        ["mds-index", "merge", "--datasets", dataset, f"{gpt2_prefix}_text_document"]
        + ["--output-prefix", str(tmp_path / "merged")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert merged.returncode == 1 and len(merged.stderr.splitlines()) == 1, merged.stderr
    assert f"was tokenized with {gpt2.record().vocab_file} + " in merged.stderr
    assert json.loads(Path(f"{dataset}.tokenize.json").read_text())["vocabulary"]["eod_id"] == 50256
