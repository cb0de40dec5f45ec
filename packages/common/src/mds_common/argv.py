"""Megatron's argparse command lines, read by typer/click: one normaliser, driven by the options the
click command declares, turns an argparse-style argv into one click parses the same way.

What argparse accepts and click does not, and how it is mapped:
- `--json-keys a b c` (nargs='+'): every option declared `multiple` takes all the values up to the
  next option, and is passed on as `--json-keys=a --json-keys=b --json-keys=c`.
- `--json-key` (an unambiguous prefix): expanded to `--json-keys`; an ambiguous prefix is a usage
  error listing the candidates; an unknown option is one naming the closest known one.
- `--data-path -0.5 A` (negative numbers as values): a token that reads as a number is a value,
  never an option; values are passed on as `--opt=value`, so click cannot mistake them either.
- `--deepspeed_config`, `--local_rank` (underscore spellings, as DeepSpeed's launcher passes them):
  `_` and `-` are the same inside an option name.
- `-h` is `--help`; `--version` is known to every command.
"""

import difflib
import re
from dataclasses import dataclass

HELP = "--help"
VERSION = "--version"
# argparse's _negative_number_matcher, with exponents and inf/nan as float() reads them.
_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|-inf(inity)?|-nan", re.IGNORECASE)


class ArgvError(Exception):
    """A command line that cannot be parsed: the message is the text after `error: `."""


@dataclass(frozen=True)
class OptionSpec:
    """What the normaliser needs to know about one declared option."""

    canonical: str  # the declared spelling passed on to click
    takes_value: bool
    multi_value: bool  # argparse nargs='+': every value up to the next option
    nargs: int = 1


def looks_like_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NUMBER.fullmatch(token)


def _key(name: str) -> str:
    return name.replace("_", "-")


def option_specs(command) -> dict[str, OptionSpec]:
    """Every spelling a click command declares (names and secondary names, `-x` and `--xx`),
    mapped to its spec; `--help`, `-h` and `--version` included."""
    specs = {}
    for param in command.params:
        if getattr(param, "param_type_name", None) != "option":
            continue
        takes_value = not (getattr(param, "is_flag", False) or getattr(param, "count", False))
        multi_value = takes_value and bool(getattr(param, "multiple", False))
        for name in [*param.opts, *param.secondary_opts]:
            specs[name] = OptionSpec(name, takes_value, multi_value, max(param.nargs, 1))
    specs.setdefault(HELP, OptionSpec(HELP, False, False))
    specs.setdefault("-h", OptionSpec(HELP, False, False))
    specs.setdefault(VERSION, OptionSpec(VERSION, False, False))
    return specs


def resolve_option(name: str, specs: dict[str, OptionSpec]) -> OptionSpec:
    """The spec that `name` (exact, underscore spelling, or unambiguous prefix of a long option)
    means; ArgvError for an ambiguous or unknown name."""
    if name in specs:
        return specs[name]
    by_key = {_key(known): known for known in specs if known.startswith("--")}
    if name.startswith("--"):
        if _key(name) in by_key:
            return specs[by_key[_key(name)]]
        candidates = sorted({by_key[key] for key in by_key if key.startswith(_key(name))})
        if len(candidates) == 1:
            return specs[candidates[0]]
        if candidates:
            raise ArgvError(f"ambiguous option: {name} could match {', '.join(candidates)}")
    close = difflib.get_close_matches(name, sorted(by_key.values()), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ArgvError(f"no such option: {name}{hint}")


@dataclass(frozen=True)
class Normalised:
    args: list[str]
    wants_version: bool = False


def normalise(tokens: list[str], specs: dict[str, OptionSpec]) -> Normalised:
    """The click argv for one command's own tokens (after its subcommand name)."""
    args: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "--":
            args.extend(tokens[index - 1 :])
            break
        if not looks_like_option(token):
            args.append(token)
            continue
        name, has_inline, inline = token.partition("=")
        spec = resolve_option(name, specs)
        if spec.canonical == VERSION:
            return Normalised(args, wants_version=True)
        if spec.canonical == HELP:
            return Normalised([*args, HELP])
        if not spec.takes_value:
            args.append(spec.canonical + (f"={inline}" if has_inline else ""))
            continue
        values = [inline] if has_inline else []
        if spec.multi_value and not has_inline:
            while index < len(tokens) and not looks_like_option(tokens[index]):
                values.append(tokens[index])
                index += 1
        elif not has_inline:
            needed = spec.nargs
            values = tokens[index : index + needed]
            if len(values) < needed or any(looks_like_option(value) for value in values):
                raise ArgvError(
                    f"{spec.canonical}: expected {'a value' if needed == 1 else f'{needed} values'}"
                )
            index += needed
        if not values:
            raise ArgvError(f"{spec.canonical}: expected at least one value")
        if spec.nargs > 1 or not spec.canonical.startswith("--"):
            # click reads `-x=v` as the value "=v", and `--opt=a b` not at all.
            args.extend([spec.canonical, *values])
        else:
            args.extend(f"{spec.canonical}={value}" for value in values)
    return Normalised(args)
