"""The installed command: user mistakes end with one stderr line and a non-zero exit, no traceback;
the subcommands are registered; preprocess_data.py's `--json-keys a b` form is accepted; `decode`
turns the ids `mds-index show` prints back into text."""

import json
import subprocess
import sys


def run_command(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mds_tokenize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
    )


def test_bad_line_is_one_line_without_traceback(shared_data, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "good"}\n{"text": "bad"\n')
    result = run_command(
        "--input",
        path,
        "--output-prefix",
        tmp_path / "out",
        "--vocab-file",
        shared_data / "gpt2-vocab.json",
        "--merge-file",
        shared_data / "gpt2-merges.txt",
        "--workers",
        2,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"mds-tokenize: error: {path}:2: not valid JSON (Expecting ',' delimiter at column 15) "
        "(fix the line, or pass --skip-bad-lines to skip such lines)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_bad_merges_file_is_one_line(shared_data, tmp_path):
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\nĠ t\nbroken-line\n")
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "x"}\n')
    result = run_command(
        "--input",
        path,
        "--output-prefix",
        tmp_path / "out",
        "--vocab",
        shared_data / "gpt2-vocab.json",
        "--merge-file",
        merges,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"mds-tokenize: error: {merges}:3: expected two space-separated symbols, got "
        "'broken-line'; "
        "is this a GPT-2 merges.txt?"
    ]


def test_usage_errors_are_one_line(tmp_path):
    result = run_command("--output-prefix", tmp_path / "x")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["mds-tokenize: error: Missing option '--input'."]
    result = run_command("merge", "--output-prefix", tmp_path / "x", "--keep-part", "--bogus")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["mds-tokenize merge: error: no such option: --bogus"]


def test_help_lists_subcommands():
    result = run_command("--help")
    assert result.returncode == 0
    for command in ("encode", "merge", "learn"):
        assert command in result.stdout


def test_json_keys_take_several_values_and_an_abbreviation(shared_data, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "Hello world", "title": "Hi"}\n')
    result = run_command(
        "--input",
        path,
        "--output-prefix",
        tmp_path / "out",
        "--vocab",
        shared_data / "gpt2-vocab.json",
        "--merge-file",
        shared_data / "gpt2-merges.txt",
        "--json-key",  # seed 004's spelling: argparse reads it as --json-keys
        "text",
        "title",
        "--append-eod",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("out_*.idx")) == [
        "out_text_document.idx",
        "out_title_document.idx",
    ]


def test_decode_reads_ids_from_arguments_or_stdin(shared_data):
    files = [
        "--vocab-file",
        shared_data / "gpt2-vocab.json",
        "--merge",
        shared_data / "gpt2-merges.txt",
    ]
    result = run_command("decode", *files, "15496", "995", "50256")
    assert (result.returncode, result.stdout) == (0, "Hello world<|endoftext|>\n"), result.stderr
    result = run_command("decode", *files, stdin="15496 995\n\n40, 716\n")
    assert (result.returncode, result.stdout) == (0, "Hello world\n\nI am\n"), result.stderr
    result = run_command("decode", *files, stdin="15496\n99999\n")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "mds-tokenize decode: error: stdin:2: token id 99999 is not in the vocabulary "
        "(ids 0..50256); was it tokenized with this vocabulary?"
    ]
    result = run_command("decode", *files, stdin="15496 x\n")
    assert result.returncode == 1 and "stdin:1: 'x' is not a token id" in result.stderr


def test_learn_takes_several_inputs_and_specials_argparse_style(tmp_path):
    texts = ["hello world, hello there", "lower lowest newer newest"]
    inputs = []
    for index, text in enumerate(texts):
        inputs.append(tmp_path / f"part{index}.jsonl")
        inputs[-1].write_text(f'{{"text": "{text}"}}\n', encoding="utf-8")
    out = tmp_path / "vocab"
    result = run_command(
        "learn",
        "--input",
        *inputs,
        "--vocab-size",
        300,
        "--output-dir",
        out,
        "--special-tokens",
        "<|endoftext|>",
        "<|pad|>",
    )
    assert result.returncode == 0, result.stderr
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert {"<|endoftext|>", "<|pad|>"} <= vocab.keys()
    config = json.loads((out / "learn-config.json").read_text(encoding="utf-8"))
    assert len(config["config"]["inputs"]) == 2
