"""mds-train's flag reference (packages/train/docs/flags.md) is generated from the flags'
`flag(help=...)` strings by scripts/train_flags.py: the table must be what the script writes
now, and name exactly the options `mds-train --help` lists. A flag added, renamed, re-documented
or re-defaulted without rerunning the script fails here."""

import importlib.util
import re
from pathlib import Path

import typer
from mds_train.cli import main, make_app

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("train_flags", ROOT / "scripts/train_flags.py")
train_flags = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train_flags)

NOT_IN_TABLE = {"--config", "--help", "--version"}  # the command's own, said in the doc's prose


def table_block() -> str:
    text = train_flags.DOC.read_text()
    start = text.index(train_flags.BEGIN) + len(train_flags.BEGIN)
    return text[start : text.index(train_flags.END)].strip("\n")


def table_flags() -> set[str]:
    return {
        name
        for line in table_block().splitlines()
        if line.startswith("| ")
        for name in re.findall(r"`(--[\w-]+)`", line.split(" | ")[1])
    }


def test_the_reference_is_what_the_script_writes_from_the_code():
    assert table_block() == train_flags.table(), "run: python scripts/train_flags.py"


def test_the_reference_names_every_option_of_the_command():
    command = typer.main.get_command(make_app())
    options = {
        name
        for param in command.params
        if not getattr(param, "hidden", False)
        for name in [*param.opts, *param.secondary_opts]
        if name.startswith("--")
    }
    assert options - NOT_IN_TABLE == table_flags()


def test_every_flag_of_the_reference_is_in_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    try:
        main(["--help"])
    except SystemExit as exit_:
        assert exit_.code in (0, None)
    shown = set(re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", capsys.readouterr().out))
    assert table_flags() <= shown
