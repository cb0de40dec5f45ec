"""The CLI dialect (docs/cli.md), held for every command of every tool by running the installed
commands as subprocesses. A new tool (mds-train) joins by adding rows to COMMANDS."""

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]  # how the user names it: ("mds-tokenize", "learn")
    distribution: str
    valid: tuple[str, ...]  # a complete command line, but for the file named {missing}
    required_flag: str | None  # dropped from `valid` for the missing-flag check
    unknown_flag: str  # a near miss of a declared flag ...
    suggestion: str  # ... and the flag the error line names
    abbreviation: tuple[str, str] | None = None  # (prefix, full flag) of a declared flag


COMMANDS = [
    Command(
        ("mds-tokenize",),
        "mds-tokenize",
        (
            "--input",
            "{missing}",
            "--output-prefix",
            "{tmp}/out",
            "--vocab",
            "{vocab}",
            "--merge-file",
            "{merges}",
            "--json-keys",
            "text",
            "title",
        ),
        "--output-prefix",
        "--jsn-keys",
        "--json-keys",
        ("--json-key", "--json-keys"),
    ),
    Command(
        ("mds-tokenize", "encode"),
        "mds-tokenize",
        (
            "--input",
            "{missing}",
            "--output-prefix",
            "{tmp}/out",
            "--vocab-file",
            "{vocab}",
            "--merge-file",
            "{merges}",
        ),
        "--merge-file",
        "--apend-eod",
        "--append-eod",
        ("--output-pre", "--output-prefix"),
    ),
    Command(
        ("mds-tokenize", "merge"),
        "mds-tokenize",
        ("--output-prefix", "{missing}", "--json-keys", "text", "title"),
        "--output-prefix",
        "--keep-prts",
        "--keep-parts",
        ("--json-key", "--json-keys"),
    ),
    Command(
        ("mds-tokenize", "learn"),
        "mds-tokenize",
        ("--input", "{missing}", "{missing}", "--vocab-size", "300", "--output-dir", "{tmp}/v"),
        "--vocab-size",
        "--vocab-sise",
        "--vocab-size",
        ("--min-freq", "--min-frequency"),
    ),
    Command(
        ("mds-tokenize", "decode"),
        "mds-tokenize",
        ("--vocab-file", "{missing}", "--merge-file", "{merges}", "1", "2"),
        "--merge-file",
        "--merges-file",
        "--merge-file",
        ("--vocab", "--vocab-file"),
    ),
    Command(
        ("mds-index", "build"),
        "mds-indexed-data",
        (
            "--data-path",
            "0.5",
            "{missing}",
            "0.5",
            "{missing}",
            "--seq-length",
            "8",
            "--train-samples",
            "4",
        ),
        "--seq-length",
        "--seq-lenght",
        "--seq-length",
        ("--train-samp", "--train-samples"),
    ),
    Command(
        ("mds-index", "merge"),
        "mds-indexed-data",
        ("--datasets", "{missing}", "{missing}", "--output-prefix", "{tmp}/m"),
        "--output-prefix",
        "--datsets",
        "--datasets",
    ),
    Command(
        ("mds-index", "info"),
        "mds-indexed-data",
        ("{missing}",),
        None,  # without its one argument it is a bare subcommand (test_bare_subcommand_...)
        "--dco",
        "--help",
    ),
    Command(
        ("mds-index", "show"),
        "mds-indexed-data",
        ("{missing}", "--doc", "0"),
        "{missing}",
        "--sampel",
        "--sample",
        ("--split-n", "--split-name"),
    ),
    Command(
        ("mds-train",),
        "mds-train",
        (
            *("--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"),
            *("--seq-length", "64", "--micro-batch-size", "2", "--train-iters", "2"),
            *("--lr", "1e-3", "--data-path", "{tmp}/data", "--vocab-file", "{missing}"),
            *("--merge-file", "{merges}", "--local_rank=0"),  # as the deepspeed launcher passes it
        ),
        "--lr",
        "--hiden-size",
        "--hidden-size",
        ("--micro-batch", "--micro-batch-size"),
    ),
    Command(
        ("mds-generate",),  # `sample` is the default command
        "mds-generate",
        ("--load", "{missing}", "--prompt", "Hello", "--top_k", "5"),
        "--load",
        "--promt",
        "--prompt",
        ("--promp", "--prompt"),
    ),
    Command(
        ("mds-generate", "sample"),
        "mds-generate",
        ("--load", "{missing}", "--stop", "a", "b", "--out-seq-length", "8"),
        "--load",
        "--temprature",
        "--temperature",
        ("--loa", "--load"),
    ),
    Command(
        ("mds-generate", "eval"),
        "mds-generate",
        ("--load", "{tmp}", "--task", "lambada", "--valid-data", "{missing}"),
        "--task",
        "--valid-dta",
        "--valid-data",
        ("--valid", "--valid-data"),
    ),
    Command(
        ("mds-merge-mp",),
        "mds-checkpoint",
        ("--load", "{missing}", "--save", "{tmp}/out", "--target-tensor-model-parallel-size", "2"),
        "--save",
        "--with-optimiser",
        "--with-optimizer",
        ("--target-tensor", "--target-tensor-model-parallel-size"),
    ),
    Command(
        ("mds-merge-mp", "merge"),
        "mds-checkpoint",
        ("--load", "{missing}", "--save", "{tmp}/out", "--model-type", "GPT"),
        "--load",
        "--iteraton",
        "--iteration",
        ("--target-pipeline", "--target-pipeline-model-parallel-size"),
    ),
    Command(
        ("mds-merge-mp", "export-hf"),
        "mds-checkpoint",
        ("--load", "{missing}", "--save", "{tmp}/hf"),
        "--save",
        "--verfy",
        "--verify",
        ("--eos-token", "--eos-token-id"),
    ),
    Command(
        ("mds-merge-mp", "import-hf"),
        "mds-checkpoint",
        (
            "--load",
            "{missing}",
            "--save",
            "{tmp}/ckpt",
            "--target-pipeline-model-parallel-size",
            "2",
        ),
        "--load",
        "--seq-lenght",
        "--seq-length",
        ("--make-vocab", "--make-vocab-size-divisible-by"),
    ),
    Command(
        ("mds-model", "info"),
        "mds-model",
        ("--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "3"),
        "--hidden-size",
        "--hiden-size",
        "--hidden-size",
        ("--num-lay", "--num-layers"),
    ),
]
# Bare invocations: the tool alone, and each subcommand (they all have required flags).
TOOLS = sorted({command.words[0] for command in COMMANDS})


def _id(command: Command) -> str:
    return " ".join(command.words)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def names_in(folder: Path, shared_data: Path) -> dict[str, str]:
    return dict(
        tmp=str(folder),
        missing=str(folder / "absent.jsonl"),
        vocab=str(shared_data / "gpt2-vocab.json"),
        merges=str(shared_data / "gpt2-merges.txt"),
    )


@pytest.fixture
def names(tmp_path, shared_data) -> dict[str, str]:
    return names_in(tmp_path, shared_data)


@dataclass(frozen=True)
class ValidRun:
    names: dict[str, str]
    result: subprocess.CompletedProcess
    left_behind: list[str]  # the folder's files right after the run


@pytest.fixture(scope="module")
def valid_run(tmp_path_factory, shared_data):
    """valid_run(command): its valid line (the file missing) run once, in a folder of its own; the
    bad-input and abbreviation tests both read it (mds-train's and mds-generate's start-ups
    import torch: seconds each)."""
    done = {}

    def run_once(command: Command) -> ValidRun:
        if command not in done:
            folder = tmp_path_factory.mktemp("dialect")
            names = names_in(folder, shared_data)
            result = run(*command.words, *fill(command.valid, names))
            done[command] = ValidRun(names, result, sorted(p.name for p in folder.iterdir()))
        return done[command]

    return run_once


def fill(args, names) -> list[str]:
    return [arg.format(**names) for arg in args]


def one_error_line(result: subprocess.CompletedProcess, command: Command) -> str:
    assert "Traceback" not in result.stderr and result.stdout == "", result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    prefix = " ".join(command.words) + ": error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix) :]


@pytest.mark.parametrize("command", COMMANDS, ids=_id)
def test_help_and_version_exit_0_on_stdout(command):
    result = run(*command.words, "--help")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith(f"Usage: {' '.join(command.words)}")
    assert "<bool>" not in result.stdout  # boolean flags read `--append-eod`
    result = run(*command.words, "--version")
    assert (result.returncode, result.stderr) == (0, "")
    from importlib.metadata import version

    assert result.stdout == f"{command.words[0]} {version(command.distribution)}\n"


@pytest.mark.parametrize("command", COMMANDS, ids=_id)
def test_unknown_flag_names_the_closest(command, names):
    result = run(*command.words, *fill(command.valid, names), command.unknown_flag, "1")
    assert result.returncode == 2
    message = one_error_line(result, command)
    assert message.startswith(f"no such option: {command.unknown_flag}")
    if command.suggestion != "--help":
        assert message.endswith(f"did you mean {command.suggestion}?")


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.required_flag], ids=_id)
def test_missing_required_flag_is_a_usage_error(command, names):
    args = list(command.valid)
    position = args.index(command.required_flag)
    takes_value = command.required_flag.startswith("--")
    del args[position : position + (2 if takes_value else 1)]
    result = run(*command.words, *fill(args, names))
    assert result.returncode == 2
    message = one_error_line(result, command)
    assert "Missing" in message or "expected" in message, message


@pytest.mark.parametrize("command", COMMANDS, ids=_id)
def test_bad_input_is_exit_1_naming_the_file(command, valid_run):
    done = valid_run(command)
    assert done.result.returncode == 1
    message = one_error_line(done.result, command)
    if command.words[0] == "mds-model":  # no files: a value the model cannot take
        assert "--num-attention-heads" in message
    else:
        assert "absent" in message, message
    assert done.left_behind == []  # nothing left behind


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.abbreviation], ids=_id)
def test_abbreviations_and_multi_value_flags(command, valid_run):
    prefix, full = command.abbreviation
    done = valid_run(command)
    args = fill(command.valid, done.names)
    abbreviated = [prefix if arg == full else arg for arg in args]
    if abbreviated == args:  # the flag is optional: add it, with a value it accepts
        values = {
            "--min-frequency": ["2"],
            "--split-name": ["train"],
            "--target-pipeline-model-parallel-size": ["1"],
            "--eos-token-id": ["0"],
            "--make-vocab-size-divisible-by": ["128"],
        }
        abbreviated += [prefix, *values[full]]
    # The line parses (exit 1 on the missing file, not 2 on the flags) and fails the same way.
    assert done.result.stderr == run(*command.words, *abbreviated).stderr


@pytest.mark.parametrize("tool", TOOLS)
def test_bare_invocation_prints_usage(tool):
    result = run(tool)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"Usage: {tool} ")
    assert "Commands:" in result.stderr or "Options:" in result.stderr  # mds-train has none


@pytest.mark.parametrize("command", [c for c in COMMANDS if len(c.words) > 1], ids=_id)
def test_bare_subcommand_prints_its_usage(command):
    result = run(*command.words)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"Usage: {' '.join(command.words)} ")


def test_negative_numbers_are_values(tmp_path):
    args = ("--data-path", "-0.5", str(tmp_path / "a"), "--seq", "8", "--train-samples", "-1")
    result = run("mds-index", "build", *args)
    assert result.returncode == 1
    assert result.stderr == (
        "mds-index build: error: --data-path: weight '-0.5' must be finite and >= 0\n"
    )


def test_ambiguous_prefix_lists_the_candidates():
    result = run("mds-model", "info", "--num", "2")
    assert result.returncode == 2
    assert result.stderr.startswith("mds-model info: error: ambiguous option: --num could match ")
    assert "--num-attention-heads, --num-key-value-heads, --num-layers" in result.stderr
