"""Command-line flags declared on config dataclasses: every mds tool's command is generated from
the flag groups its config is made of (the signature is the config, as litgpt's).

`flag(...)` is a dataclass field whose metadata holds its spellings and help. A flag group is a
frozen dataclass of such fields, declared once by the package that owns the quantity (the GPT
shape in `mds_model.flags`, the tokenizer in `mds_tokenize.flags`, checkpoint loading in
`mds_checkpoint.flags`); a tool's config takes a whole group by inheriting it, or one field of it
with `restate`, which may change only the default, whether it is required, and a note on its help.
`command_function` turns groups into a typer command; `group_from_values` builds a group back from
the parsed values. Field names are the Megatron flags' argparse dests
(`tensor_model_parallel_size`).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any

import typer

_SPEC = "mds_flag"
_KEEP: Any = object()  # restate(): keep the group's value


@dataclasses.dataclass(frozen=True)
class FlagSpec:
    names: tuple[str, ...]  # spellings, the first shown in errors; none: a positional argument
    help: str
    choices: tuple[str, ...] | None = None
    multiple: bool = False  # argparse nargs='+': `--data-path 0.3 A 0.7 B`
    nargs: int = 1  # a fixed count, e.g. 3 for --rampup-batch-size
    is_flag: bool = False  # a plain switch: `--append-eod`
    negates: bool = False  # a switch that sets its field to False: `--ignore-eod` (stop_at_eod)
    required: bool = False
    shown_default: str | None = None  # `[default: TEXT]` where the default is not a value
    # The command line's type where the field's differs (`--partition K/N` is a string, the field
    # a pair), and the function from one to the other (a ValueError names the flag: exit 1).
    cli_type: Any = None
    parse: Callable[[Any], Any] | None = None

    @property
    def is_argument(self) -> bool:
        return not self.names


def flag(
    *names: str,
    help: str,  # noqa: A002 - mirrors click's own keyword
    default: Any = None,
    choices: tuple[str, ...] | None = None,
    multiple: bool = False,
    nargs: int = 1,
    required: bool = False,
    shown_default: str | None = None,
    cli_type: Any = None,
    parse: Callable[[Any], Any] | None = None,
    negates: bool = False,
) -> Any:
    """A config field that is a command-line flag (no `names`: a positional argument)."""
    spec = FlagSpec(
        names=names,
        help=help,
        choices=choices,
        multiple=multiple,
        nargs=nargs,
        is_flag=isinstance(default, bool),
        required=required,
        shown_default=shown_default,
        cli_type=cli_type,
        parse=parse,
        negates=negates,
    )
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def restate(
    group: type,
    name: str,
    *,
    default: Any = _KEEP,
    required: bool | None = None,
    shown_default: str | None = _KEEP,
    note: str | None = None,
) -> Any:
    """The flag `name` of `group`, for another config: the same spellings and help, with another
    default, required-ness or `[default: ...]` text, and `note` appended to the help."""
    field = {f.name: f for f in dataclasses.fields(group)}[name]
    spec = field.metadata[_SPEC]
    changes: dict[str, Any] = {}
    if required is not None:
        changes["required"] = required
    if shown_default is not _KEEP:
        changes["shown_default"] = shown_default
    if note:
        changes["help"] = f"{spec.help} {note}"
    value = field.default if default is _KEEP else default
    return dataclasses.field(default=value, metadata={_SPEC: dataclasses.replace(spec, **changes)})


def flag_spec(field: dataclasses.Field) -> FlagSpec | None:
    """A config field's flag, if it has one."""
    return field.metadata.get(_SPEC)


def flag_fields(group: type) -> list[tuple[dataclasses.Field, FlagSpec]]:
    return [(f, f.metadata[_SPEC]) for f in dataclasses.fields(group) if _SPEC in f.metadata]


def flag_names(group: type) -> dict[str, str]:
    """Field name -> its first spelling, for error messages."""
    return {field.name: spec.names[0] for field, spec in flag_fields(group) if spec.names}


def typer_parameters(group: type) -> list[inspect.Parameter]:
    """One keyword parameter per flagged field, annotated for typer: the command's signature."""
    hints = typing.get_type_hints(group)
    parameters = []
    for field, spec in flag_fields(group):
        annotation = hints[field.name] if spec.cli_type is None else spec.cli_type
        if spec.choices:
            annotation = typing.Literal[spec.choices]  # shown as [a|b|c] in --help
            if field.default is None:
                annotation = annotation | None
        elif spec.multiple:
            annotation = list[_item_type(annotation)]
        field_default = (not field.default) if spec.negates else field.default
        show_default = not (field_default is None or field_default is False or field_default == ())
        text = spec.help
        if spec.shown_default is not None:  # as click shows a value (its own text adds "()")
            text, show_default = f"{text}  [default: {spec.shown_default}]", False
        if spec.is_argument:
            option = typer.Argument(help=text, show_default=show_default)
        else:
            option = typer.Option(*spec.names, help=text, show_default=show_default)
        default = inspect.Parameter.empty if spec.required else field_default
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


def _item_type(annotation: Any) -> Any:
    """What one value of a multi-value flag is: `str` for `tuple[str, ...] | None`, `Path` for a
    field that keeps one `Path` of them (parse picks it)."""
    if typing.get_origin(annotation) is tuple:
        return typing.get_args(annotation)[0]
    arguments = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if arguments:
        return _item_type(arguments[0])
    return annotation


def group_from_values(group: type, values: Mapping[str, Any], **derived: Any):
    """The frozen group built from the parsed values of its flagged fields (`derived`: the values
    of its other fields, or ones that replace a parsed value)."""
    kwargs = dict(derived)
    for field, spec in flag_fields(group):
        if field.name not in values or field.name in derived:
            continue
        value = values[field.name]
        if spec.multiple or spec.nargs > 1:
            value = tuple(value) if value else (None if field.default is None else ())
        if spec.parse is not None and value is not None:
            value = spec.parse(value)
        if spec.negates:
            value = not value
        kwargs[field.name] = value
    return group(**kwargs)


def command_function(
    body: Callable[..., Any],
    groups: Iterable[type],
    *,
    name: str,
    doc: str,
    before: Iterable[inspect.Parameter] = (),
    after: Iterable[inspect.Parameter] = (),
) -> Callable[..., Any]:
    """A typer command function named `name` whose options are the groups' flags (between the
    `before` and `after` parameters); it calls `body(**values)` with every parsed value by
    parameter name."""
    parameters = [*before]
    for group in groups:
        parameters += typer_parameters(group)
    parameters += after
    seen: set[str] = set()
    for parameter in parameters:
        if parameter.name in seen:  # two groups declaring one flag: a bug, not a user error
            raise TypeError(f"{name}: the parameter {parameter.name} is declared twice")
        seen.add(parameter.name)

    def command(**values: Any) -> Any:
        return body(**values)

    command.__signature__ = inspect.Signature(parameters)
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    command.__name__ = command.__qualname__ = name
    command.__doc__ = doc
    return command
