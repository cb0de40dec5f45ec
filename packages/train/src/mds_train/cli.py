"""`mds-train`: Megatron-DeepSpeed's `pretrain_gpt.py` flags in, a training run out.

The command's signature is the config: its options are generated from the config sections
(config.py) and parsed in the house dialect (docs/cli.md); `--config run.toml` supplies defaults
by flag name and the command line wins. Run under `deepspeed`, `torchrun`, `srun`, or as one
plain process.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from mds_common.cli import new_app, run_app, run_then_exit
from mds_common.flags import command_function, group_from_values

from .config import SECTIONS, TrainConfig
from .megatron_flags import megatron_flags_given, megatron_parameters

PRESET_FLAG = "--config"


def _preset(ctx: typer.Context, path: Path | None) -> Path | None:
    """--config: a TOML file whose keys are flag names (dashes or underscores); CLI wins."""
    if path is None:
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise typer.BadParameter("needs Python 3.11 or newer (tomllib)") from None
    try:
        preset = tomllib.loads(path.read_text())
    except OSError as error:
        raise typer.BadParameter(f"{path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise typer.BadParameter(f"{path}: {error}") from None
    names = {param.name for param in ctx.command.params}
    defaults: dict[str, Any] = {}
    for key, value in preset.items():
        name = key.lstrip("-").replace("-", "_")
        if name not in names or name.startswith(("ignored_", "refused_")):
            raise typer.BadParameter(f"{path}: unknown key {key!r}")
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


def build_config(values: dict[str, Any]) -> TrainConfig:
    return TrainConfig(
        **{name: group_from_values(section, values) for name, section in SECTIONS.items()}
    )


def given_fields(ctx: typer.Context) -> frozenset[str]:
    """The parameters the user gave, on the command line or in a --config preset: the values a
    --deepspeed_config file may not contradict (defaults yield to it)."""
    # By name: typer vendors its own click, whose ParameterSource is not click's.
    sources = ("COMMANDLINE", "DEFAULT_MAP")
    return frozenset(
        name
        for name in ctx.params
        if getattr(ctx.get_parameter_source(name), "name", None) in sources
    )


def _train(**values: Any) -> int:
    from mds_tokenize.flags import tokenizer_spec

    from .run import run

    given = given_fields(values.pop("ctx"))
    values.pop("preset", None)
    notes = megatron_flags_given(values)  # a refused flag: one usage line, before anything
    config = build_config(values)
    # A missing or misplaced tokenizer flag is a usage error (exit 2), as in the other tools.
    tokenizer_spec(config.data)
    return run(config, warnings=notes, given=given)


def make_app() -> typer.Typer:
    preset = inspect.Parameter(
        "preset",
        inspect.Parameter.KEYWORD_ONLY,
        default=None,
        annotation=Annotated[
            Path | None,
            typer.Option(
                PRESET_FLAG,
                is_eager=True,
                callback=_preset,
                help="TOML preset of flags (keys are flag names); the command line wins.",
            ),
        ],
    )
    context = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    train = command_function(
        _train,
        SECTIONS.values(),
        name="train",
        doc="Train a GPT with DeepSpeed: TP, PP (pipeline engine), ZeRO 0-3. Flags are "
        "Megatron-DeepSpeed's pretrain_gpt.py spellings.",
        before=[context, preset],
        after=megatron_parameters(),
    )
    app = new_app(help=train.__doc__)
    app.command(context_settings={"max_content_width": 100})(train)
    return app


def main(argv: list[str] | None = None) -> None:
    if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) != "0":
        # Read when torch is imported: on the other ranks, torch's C++ warnings (a broken store
        # connection, with its C++ stack, when rank 0 stops the job) would bury rank 0's line.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    run_app(make_app(), prog="mds-train", distribution="mds-train", argv=argv)


def script() -> None:
    """The `mds-train` command (and `python -m mds_train`, as launchers start it): `main()`,
    then each rank's process ends without tearing the interpreter down
    (mds_common.cli.run_then_exit): 1-2 s of each tiny run's process on a 2-core VM."""
    run_then_exit(main)
