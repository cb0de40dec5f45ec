"""`mds-train`: Megatron-DeepSpeed's `pretrain_gpt.py` flags in, a training run out.

The command's options are generated from the config sections (config.py); `--config run.toml`
supplies defaults by flag name (the command line wins). Run under `deepspeed`, `torchrun`,
`srun`, or as one plain process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from .config import SECTIONS, TrainConfig
from .options import click_params, ignored_flags_given, ignored_params, section_from_values


def _preset(ctx: click.Context, param: click.Parameter, path: Path | None) -> Path | None:
    """--config: a TOML file whose keys are flag names (dashes or underscores); CLI wins."""
    if path is None:
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise click.BadParameter("needs Python 3.11 or newer (tomllib)") from None
    try:
        preset = tomllib.loads(path.read_text())
    except OSError as error:
        raise click.BadParameter(f"{path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise click.BadParameter(f"{path}: {error}") from None
    names = {p.name for p in ctx.command.params}
    defaults: dict[str, Any] = {}
    for key, value in preset.items():
        name = key.lstrip("-").replace("-", "_")
        if name not in names:
            raise click.BadParameter(f"{path}: unknown key {key!r}")
        defaults[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


def build_config(values: dict[str, Any]) -> TrainConfig:
    return TrainConfig(
        **{name: section_from_values(section, values) for name, section in SECTIONS.items()}
    )


def _train(**values: Any) -> int:
    from .run import run

    config = build_config(values)
    return run(config, warnings=ignored_flags_given(values))


def make_command() -> click.Command:
    params: list[click.Parameter] = [
        click.Option(
            ["--config"],
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            is_eager=True,
            expose_value=False,
            callback=_preset,
            help="TOML preset of flags (keys are flag names); the command line wins.",
        )
    ]
    for section in SECTIONS.values():
        params += click_params(section)
    params += ignored_params()
    return click.Command(
        "mds-train",
        params=params,
        callback=_train,
        help="Train a GPT with DeepSpeed: TP, PP (pipeline engine), ZeRO 0-3. Flags are "
        "Megatron-DeepSpeed's pretrain_gpt.py spellings.",
        context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]},
    )


def main(argv: list[str] | None = None) -> None:
    command = make_command()
    try:
        code = command.main(
            args=list(sys.argv[1:] if argv is None else argv),
            prog_name="mds-train",
            standalone_mode=False,
        )
    except click.UsageError as error:
        print(f"mds-train: error: {error.format_message()}", file=sys.stderr)
        sys.exit(2)
    except (ValueError, OSError) as error:
        rank = int(os.environ.get("RANK", "0"))
        where = f"[rank {rank}] " if rank else ""
        print(f"{where}mds-train: error: {error}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code or 0)
