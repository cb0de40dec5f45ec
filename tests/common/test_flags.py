"""mds_common.flags: commands generated from config dataclasses, run through the dialect."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import pytest
from mds_common.cli import new_app, run_app
from mds_common.flags import command_function, flag, flag_names, group_from_values, restate


@dataclass(frozen=True, kw_only=True)
class Shape:
    num_layers: int | None = flag("--num-layers", help="Transformer layers.")
    ffn_hidden_size: int | None = flag(
        "--ffn-hidden-size", help="MLP width.", shown_default="4 x hidden size"
    )


@dataclass(frozen=True, kw_only=True)
class Inputs(Shape):
    num_layers: int = restate(Shape, "num_layers", required=True)
    paths: tuple[Path, ...] = flag("--paths", multiple=True, help="Inputs.")
    keys: tuple[str, ...] = flag("--keys", multiple=True, default=("text",), help="Keys.")
    append_eod: bool = flag("--append-eod", default=False, help="Append the EOD.")
    prefix: str = flag(required=True, help="Dataset prefix.")  # positional


@dataclass(frozen=True, kw_only=True)
class Checked:
    num_layers: int | None = restate(Shape, "num_layers", note="Checked against the checkpoint.")


def run(groups, argv, capsys):
    seen = []

    def body(**values):
        seen.append([group_from_values(group, values) for group in groups])

    app = new_app("test")
    app.command()(command_function(body, groups, name="go", doc="Go."))
    with pytest.raises(SystemExit) as exit_:
        run_app(app, prog="tool", distribution="mds-common", argv=argv)
    captured = capsys.readouterr()
    return exit_.value.code, seen, captured.out + captured.err


def test_groups_parse_to_frozen_configs(capsys):
    argv = ["P", "--num-lay", "2", "--paths", "a", "b", "--keys", "x", "y", "--append-eod"]
    code, seen, _ = run([Inputs], argv, capsys)
    assert code == 0
    assert seen == [
        [
            Inputs(
                num_layers=2,
                paths=(Path("a"), Path("b")),
                keys=("x", "y"),
                append_eod=True,
                prefix="P",
            )
        ]
    ]
    code, seen, _ = run([Inputs], ["P", "--num-layers", "2"], capsys)
    assert seen[0][0].paths is None and seen[0][0].keys == ("text",)  # the fields' defaults


def test_restate_changes_only_default_required_and_note(capsys):
    code, _, output = run([Inputs], ["P"], capsys)  # required here, optional in Shape
    assert code == 2 and "Missing option '--num-layers'" in output
    code, _, help_text = run([Checked], ["--help"], capsys)
    assert code == 0
    assert "Transformer layers. Checked against the checkpoint." in " ".join(help_text.split())
    assert flag_names(Checked) == {"num_layers": "--num-layers"}
    code, _, help_text = run([Shape], ["--help"], capsys)
    assert "MLP width.  [default: 4 x hidden size]" in help_text  # no click "(...)"


def test_a_flag_declared_twice_in_one_command_is_an_error():
    with pytest.raises(TypeError, match="num_layers is declared twice"):
        command_function(lambda **_: None, [Shape, Checked], name="go", doc="Go.")


def test_signature_is_keyword_only_in_group_order():
    command = command_function(lambda **_: None, [Inputs], name="go", doc="Go.")
    parameters = inspect.signature(command).parameters.values()
    assert [p.name for p in parameters] == [
        "num_layers",
        "ffn_hidden_size",
        "paths",
        "keys",
        "append_eod",
        "prefix",
    ]
    assert {p.kind for p in parameters} == {inspect.Parameter.KEYWORD_ONLY}
