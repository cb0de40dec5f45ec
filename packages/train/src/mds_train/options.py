"""Command-line flags declared on the config dataclasses themselves (the signature is the config).

`flag(...)` is a dataclass field whose metadata names its spellings and help; `typer_parameters`
turns a section's fields into the keyword parameters of the typer command, and
`section_from_values` builds the frozen section back from the parsed values. Megatron's flags
that we accept but do not need are in `IGNORED`.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Annotated, Any

import typer

_SPEC = "mds_train_flag"


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    names: tuple[str, ...]
    help: str
    choices: tuple[str, ...] | None = None
    multiple: bool = False  # argparse nargs='+': `--data-path 0.3 A 0.7 B`
    nargs: int = 1  # a fixed count, e.g. 3 for --rampup-batch-size
    is_flag: bool = False
    required: bool = False


def flag(
    *names: str,
    help: str,  # noqa: A002 - mirrors click's own keyword
    default: Any = None,
    choices: tuple[str, ...] | None = None,
    multiple: bool = False,
    nargs: int = 1,
    required: bool = False,
) -> Any:
    spec = FlagSpec(
        names=names,
        help=help,
        choices=choices,
        multiple=multiple,
        nargs=nargs,
        is_flag=isinstance(default, bool),
        required=required,
    )
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def typer_parameters(section: type) -> list[inspect.Parameter]:
    """One keyword parameter per flagged field, annotated for typer: the command's signature."""
    hints = typing.get_type_hints(section)
    parameters = []
    for field in dataclasses.fields(section):
        spec: FlagSpec | None = field.metadata.get(_SPEC)
        if spec is None:
            continue
        annotation = hints[field.name]
        if spec.choices:
            annotation = typing.Literal[spec.choices]  # shown as [a|b|c] in --help
            if field.default is None:
                annotation = annotation | None
        elif spec.multiple:
            annotation = list[str]
        option = typer.Option(
            *spec.names,
            help=spec.help,
            show_default=not (
                field.default is None or field.default is False or field.default == ()
            ),
        )
        default = inspect.Parameter.empty if spec.required else field.default
        if spec.multiple and not spec.required:
            default = list(field.default or ())
        parameters.append(
            inspect.Parameter(
                field.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[annotation, option],
            )
        )
    return parameters


def section_from_values(section: type, values: dict[str, Any]):
    """The frozen section built from the parsed values of its flagged fields."""
    kwargs = {}
    for field in dataclasses.fields(section):
        if _SPEC not in field.metadata or field.name not in values:
            continue
        value = values[field.name]
        if field.metadata[_SPEC].multiple or field.metadata[_SPEC].nargs > 1:
            value = tuple(value) if value else (None if field.default is None else ())
        kwargs[field.name] = value
    return section(**kwargs)


def flag_names(section: type) -> dict[str, str]:
    """Field name -> its first spelling, for error messages."""
    return {
        f.name: f.metadata[_SPEC].names[0]
        for f in dataclasses.fields(section)
        if _SPEC in f.metadata
    }


# Megatron-DeepSpeed flags whose job is done another way here: accepted, and each named once in a
# warning. Value-taking flags map to True; plain switches to False.
IGNORED: dict[str, tuple[bool, str]] = {
    "--deepspeed": (False, "DeepSpeed is always on"),
    "--data-impl": (True, "mmap is the only dataset format"),
    "--dataset-impl": (True, "mmap is the only dataset format"),
    "--DDP-impl": (True, "DeepSpeed's engine does data parallelism"),
    "--local_rank": (True, ""),  # the deepspeed launcher adds it; ranks come from the environment
    "--local-rank": (True, ""),
    "--codecarbon-dir": (True, "energy tracking is not built in"),
    "--partition-activations": (False, "activation checkpointing is mds_model's own"),
    "--deepspeed-activation-checkpointing": (False, "activation checkpointing is mds_model's own"),
    "--contigious-checkpointing": (False, "activation checkpointing is mds_model's own"),
    "--checkpoint-in-cpu": (False, "activation checkpointing is mds_model's own"),
    "--synchronize-each-layer": (False, "activation checkpointing is mds_model's own"),
    "--no-masked-softmax-fusion": (False, "use --no-fused-kernels to turn every kernel off"),
    "--no-bias-gelu-fusion": (False, "use --no-fused-kernels to turn every kernel off"),
    "--no-bias-dropout-fusion": (False, "use --no-fused-kernels to turn every kernel off"),
    "--tensorboard-log-interval": (True, "TensorBoard scalars are written every --log-interval"),
    "--num-workers": (True, "the data loader reads memory-mapped samples in the main process"),
    "--pipeline-model-parallel-impl": (True, "the DeepSpeed pipeline engine is the only one"),
    "--no-pipeline-parallel": (False, "--pipeline-model-parallel-size 1 uses the plain engine"),
    "--cpu-optimizer": (False, "offload the optimizer in the DeepSpeed config"),
    "--override-lr-scheduler": (False, "the schedule always comes from the flags"),
    "--use-checkpoint-lr-scheduler": (False, "the schedule always comes from the flags"),
}


def _ignored_dest(name: str) -> str:
    return "ignored_" + name.lstrip("-").replace("-", "_").lower()


def ignored_parameters() -> list[inspect.Parameter]:
    """Hidden options for IGNORED; `--local_rank` and `--local-rank` share one."""
    parameters, seen = [], set()
    for name, (takes_value, _) in IGNORED.items():
        dest = _ignored_dest(name)
        if dest in seen:
            continue
        seen.add(dest)
        names = [n for n in IGNORED if _ignored_dest(n) == dest]
        annotation = str | None if takes_value else bool
        parameters.append(
            inspect.Parameter(
                dest,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if takes_value else False,
                annotation=Annotated[annotation, typer.Option(*names, hidden=True)],
            )
        )
    return parameters


def ignored_flags_given(values: dict[str, Any]) -> list[str]:
    """The ignored flags present on the command line, with why each is ignored."""
    given = {}
    for name, (_, why) in IGNORED.items():
        dest = _ignored_dest(name)
        if why and values.get(dest) not in (None, False):
            given.setdefault(dest, f"{name} is accepted and ignored: {why}")
    return list(given.values())
