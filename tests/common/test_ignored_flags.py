"""mds_common.ignored_flags: a command accepts the Megatron flags it does not use, less the ones it
declares, and names each one given once on stderr."""

from typing import Annotated

import pytest
import typer
from mds_common.cli import new_app, run_app
from mds_common.ignored_flags import MANY, TRAINING_FLAGS, IgnoredFlags, ignored

FLAGS = (
    IgnoredFlags(
        [
            ignored("--vocab-file", why="the checkpoint's tokenizer is kept"),
            ignored("--local-rank", why="ranks come from the environment", env="LOCAL_RANK"),
            ignored("--data-path", why="nothing is read", nargs=MANY),
            ignored("--rampup-batch-size", why="nothing is trained", nargs=3),
        ]
    )
    + TRAINING_FLAGS
)


def app_and_calls():
    calls = []
    app = new_app("test")

    @app.command()
    @FLAGS.accepting
    def merge(
        load: Annotated[str, typer.Option("--load", help="in")],
        micro_batch_size: Annotated[int, typer.Option("--micro-batch-size", help="rows")] = 8,
    ) -> None:
        calls.append((load, micro_batch_size))

    return app, calls


def run(capsys, caplog, *argv):
    """Exit code, the command's calls, stderr; the notes (logged) land in `caplog`."""
    app, calls = app_and_calls()
    caplog.clear()
    with pytest.raises(SystemExit) as exit_:
        run_app(app, prog="tool", distribution="mds-common", argv=list(argv))
    return exit_.value.code, calls, capsys.readouterr().err


def test_each_flag_given_is_named_once_and_the_command_runs(capsys, caplog, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    code, calls, _ = run(
        capsys, caplog, "--load", "x", "--vocab-file", "v.json", "--lr", "1e-4", "--fp16",
        "--data-path", "0.3", "A", "0.7", "B", "--rampup-batch-size", "2", "2", "1_000",
        "--local_rank=0", "--no-load-optim", "--micro-batch-size", "4", "--lr", "2e-4",
    )  # fmt: skip
    assert code == 0 and calls == [("x", 4)]
    assert caplog.messages == [
        "--vocab-file is accepted and ignored: the checkpoint's tokenizer is kept",
        "--local-rank is accepted and ignored: ranks come from the environment",
        "--data-path is accepted and ignored: nothing is read",
        "--rampup-batch-size is accepted and ignored: nothing is trained",
        "--lr is accepted and ignored: a training flag; the checkpoint gives the model",
        "--fp16 is accepted and ignored: a training flag; the checkpoint gives the model",
        "--no-load-optim is accepted and ignored: no optimizer state is loaded here",
    ]


def test_a_launchers_own_local_rank_is_not_noted(capsys, caplog, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    run(capsys, caplog, "--load", "x", "--local_rank=1")
    assert caplog.messages == []
    run(capsys, caplog, "--load", "x", "--local_rank=0")
    assert caplog.messages == [
        "--local-rank is accepted and ignored: ranks come from the environment"
    ]


def test_declared_flags_stay_the_commands_and_unknown_ones_are_errors(capsys, caplog):
    app, _ = app_and_calls()
    command = typer.main.get_command(app)
    hidden = [p for p in command.params if getattr(p, "hidden", False)]
    assert "--micro-batch-size" not in {name for p in hidden for name in p.opts}
    assert "--vocab-file" in {name for p in hidden for name in p.opts}
    code, calls, err = run(capsys, caplog, "--load", "x", "--lrr", "1")
    assert code == 2 and calls == [] and err.startswith("tool: error: no such option: --lrr")
