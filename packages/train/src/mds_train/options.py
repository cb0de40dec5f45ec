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
from mds_common.ignored_flags import IgnoredFlags, ignored

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


# Megatron-DeepSpeed flags whose job is done another way here: accepted, and each one given named
# once in a note (mds_common.ignored_flags).
_ACTIVATIONS = "activation checkpointing is mds_model's own"
_FUSION = "use --no-fused-kernels to turn every kernel off"
_SCHEDULE = "the schedule always comes from the flags"
IGNORED = IgnoredFlags(
    [
        ignored("--deepspeed", why="DeepSpeed is always on", nargs=0),
        ignored("--data-impl", "--dataset-impl", why="mmap is the only dataset format"),
        ignored("--DDP-impl", why="DeepSpeed's engine does data parallelism"),
        # The deepspeed launcher adds it beside LOCAL_RANK: noted only when the two differ.
        ignored(
            "--local_rank",
            "--local-rank",
            why="the local rank comes from the LOCAL_RANK environment variable",
            env="LOCAL_RANK",
        ),
        ignored("--codecarbon-dir", why="energy tracking is not built in"),
        ignored("--partition-activations", why=_ACTIVATIONS, nargs=0),
        ignored("--deepspeed-activation-checkpointing", why=_ACTIVATIONS, nargs=0),
        ignored("--contigious-checkpointing", why=_ACTIVATIONS, nargs=0),
        ignored("--checkpoint-in-cpu", why=_ACTIVATIONS, nargs=0),
        ignored("--synchronize-each-layer", why=_ACTIVATIONS, nargs=0),
        ignored("--no-masked-softmax-fusion", why=_FUSION, nargs=0),
        ignored("--no-bias-dropout-fusion", why=_FUSION, nargs=0),
        ignored(
            "--tensorboard-log-interval", why="TensorBoard scalars are written every --log-interval"
        ),
        ignored(
            "--num-workers", why="the data loader reads memory-mapped samples in the main process"
        ),
        ignored(
            "--pipeline-model-parallel-impl", why="the DeepSpeed pipeline engine is the only one"
        ),
        ignored(
            "--no-pipeline-parallel",
            why="--pipeline-model-parallel-size 1 uses the plain engine",
            nargs=0,
        ),
        ignored("--cpu-optimizer", why="offload the optimizer in the DeepSpeed config", nargs=0),
        ignored("--override-lr-scheduler", why=_SCHEDULE, nargs=0),
        ignored("--use-checkpoint-lr-scheduler", why=_SCHEDULE, nargs=0),
    ]
)


def ignored_parameters() -> list[inspect.Parameter]:
    """Hidden options for IGNORED."""
    return IGNORED.parameters()


def ignored_flags_given(values: dict[str, Any]) -> list[str]:
    """The ignored flags present on the command line, with why each is ignored."""
    return IGNORED.notes(values)
