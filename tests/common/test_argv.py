"""mds_common.argv: argparse command lines (Megatron's) read through a click command's options."""

from typing import Annotated

import pytest
import typer
from mds_common.argv import ArgvError, normalise, option_specs
from mds_common.cli import new_app

app = new_app("test")


@app.command()
def train(
    data_path: Annotated[list[str], typer.Option(help="weights and prefixes")],
    deepspeed_config: Annotated[str, typer.Option("--deepspeed_config", help="DeepSpeed's")] = "",
    local_rank: Annotated[int, typer.Option(help="set by the launcher")] = 0,
    lr: Annotated[float, typer.Option(help="learning rate")] = 1e-4,
    lr_decay_style: Annotated[str, typer.Option(help="schedule")] = "cosine",
    fp16: Annotated[bool, typer.Option("--fp16", help="half precision")] = False,
    output: Annotated[str, typer.Option("--output", "-o", help="short spelling")] = "",
) -> None:
    """A few of mds-train's flags."""


SPECS = option_specs(typer.main.get_command(app))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--data-path", "-0.5", "A", "1e-3", "B"],
         ["--data-path=-0.5", "--data-path=A", "--data-path=1e-3", "--data-path=B"]),
        (["--data-path=A", "--data-path", "B"], ["--data-path=A", "--data-path=B"]),
        (["--local_rank=3", "--deepspeed-config", "ds.json"],
         ["--local-rank=3", "--deepspeed_config=ds.json"]),
        (["--lr", "-1", "--fp", "--lr-d", "linear"],
         ["--lr=-1", "--fp16", "--lr-decay-style=linear"]),
        (["-o", "-x"], None),
        (["-o", "out", "--", "--lr"], ["-o", "out", "--", "--lr"]),
        (["--lr", "2", "--version", "--bogus"], "version"),
        (["-h"], ["--help"]),
    ],
)  # fmt: skip
def test_normalise(argv, expected):
    if expected is None:
        with pytest.raises(ArgvError, match="-o: expected a value"):
            normalise(argv, SPECS)
        return
    result = normalise(argv, SPECS)
    if expected == "version":
        assert result.wants_version
    else:
        assert result.args == expected and not result.wants_version


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--l", "1"], "ambiguous option: --l could match --local-rank, --lr, --lr-decay-style"),
        (["--lr-decay-stile", "x"],
         "no such option: --lr-decay-stile; did you mean --lr-decay-style?"),
        (["--zzz"], "no such option: --zzz"),
        (["--data-path", "--fp16"], "--data-path: expected at least one value"),
        (["--lr"], "--lr: expected a value"),
    ],
)  # fmt: skip
def test_usage_errors(argv, message):
    with pytest.raises(ArgvError) as error:
        normalise(argv, SPECS)
    assert str(error.value) == message
