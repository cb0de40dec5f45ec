"""The installed command: user mistakes end with one stderr line and a non-zero exit, no traceback;
the subcommands are registered; preprocess_data.py's `--json-keys a b` form is accepted."""

import json
import subprocess
import sys

from mds_tokenize.cli import _expand_multi_value


def run_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mds_tokenize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
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
    assert result.stderr.splitlines() == [
        "mds-tokenize encode: error: Missing option '--input'. (see mds-tokenize encode --help)"
    ]
    result = run_command("merge", "--output-prefix", tmp_path / "x", "--bogus")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "mds-tokenize merge: error: No such option: --bogus (see mds-tokenize merge --help)"
    ]


def test_help_lists_subcommands():
    result = run_command("--help")
    assert result.returncode == 0
    for command in ("encode", "merge", "learn"):
        assert command in result.stdout


def test_json_keys_nargs_expansion():
    argv = ["encode", "--json-keys", "text", "title", "--append-eod", "--json-keys", "x"]
    assert _expand_multi_value(argv, "--json-keys") == [
        "encode",
        "--json-keys",
        "text",
        "--json-keys",
        "title",
        "--append-eod",
        "--json-keys",
        "x",
    ]


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
