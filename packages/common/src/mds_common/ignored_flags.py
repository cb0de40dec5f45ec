"""Megatron flags a tool accepts and does not use: hidden options, and one note per flag given.

A script written for Megatron-DeepSpeed passes the same flag groups to every tool (`$GPT_ARGS` to
pretraining, merging and generation alike); each tool declares the flags it uses and accepts the
others here, naming each one given once on stderr: `--lr is accepted and ignored: <why>`.
A flag whose request a tool cannot carry out is refused instead (`RefusedFlags`): accepted by the
parser as the same hidden option, then ended with one usage line `--num-experts: <what the tool
does instead>` (exit 2, as an unknown flag was). `TRAINING_FLAGS` lists `pretrain_gpt.py`'s
training-only flags for the tools that do not train.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import typer

logger = logging.getLogger(__name__)

MANY = -1  # argparse nargs='+': every value up to the next flag


@dataclass(frozen=True)
class IgnoredFlag:
    names: tuple[str, ...]  # spellings; the note names the first
    why: str
    nargs: int = 1  # values it takes: 0 for a switch, MANY for argparse's '+'
    # A launcher's copy of this environment variable (`--local_rank` beside LOCAL_RANK): no note
    # when the two agree, since the user did not type it.
    env: str | None = None

    @property
    def dest(self) -> str:
        return "ignored_" + self.names[0].lstrip("-").replace("-", "_").lower()

    def note(self) -> str:
        return f"{self.names[0]} is accepted and ignored: {self.why}"


def ignored(*names: str, why: str, nargs: int = 1, env: str | None = None) -> IgnoredFlag:
    return IgnoredFlag(names=names, why=why, nargs=nargs, env=env)


@dataclass(frozen=True)
class RefusedFlag:
    names: tuple[str, ...]  # spellings; the error names the first
    why: str  # what the tool does instead
    nargs: int = 1
    # Values that ask for what the tool does anyway (`--num-experts 1`: the dense model): these
    # are accepted and noted as an ignored flag is, with `harmless` as the reason.
    allowed: tuple[str, ...] = ()
    harmless: str = ""

    @property
    def dest(self) -> str:
        return "refused_" + self.names[0].lstrip("-").replace("-", "_").lower()

    def error(self) -> str:
        return f"{self.names[0]}: {self.why}"

    def is_allowed(self, value: Any) -> bool:
        values = value if isinstance(value, (list, tuple)) else [value]
        return bool(self.allowed) and all(str(v) in self.allowed for v in values)


class FlagRefused(typer.BadParameter):
    """A refused flag given: exit 2, the message as is (no "Invalid value")."""

    def format_message(self) -> str:
        return self.message


def refused(
    *names: str, why: str, nargs: int = 1, allowed: tuple[str, ...] = (), harmless: str = ""
) -> RefusedFlag:
    return RefusedFlag(names=names, why=why, nargs=nargs, allowed=allowed, harmless=harmless)


class RefusedFlags:
    """A tool's refused flags: hidden typer parameters, and the usage error for the first given."""

    def __init__(self, flags: Iterable[RefusedFlag]) -> None:
        self.flags = tuple(flags)

    @property
    def dests(self) -> set[str]:
        return {flag.dest for flag in self.flags}

    def parameters(self) -> list[inspect.Parameter]:
        return [_hidden_parameter(flag.dest, flag.names, flag.nargs) for flag in self.flags]

    def check(self, values: Mapping[str, Any]) -> list[str]:
        """Raises `FlagRefused` (a usage error, exit 2) for the first refused flag given with a
        value it refuses; returns the notes for those given with an allowed value."""
        notes = []
        for flag in self.flags:
            value = values.get(flag.dest)
            if value in (None, False, [], ()):
                continue
            if not flag.is_allowed(value):
                raise FlagRefused(flag.error())
            shown = " ".join(value) if isinstance(value, (list, tuple)) else value
            notes.append(f"{flag.names[0]} {shown} is accepted and ignored: {flag.harmless}")
        return notes


def _key(name: str) -> str:
    return name.replace("_", "-").lower()


class IgnoredFlags:
    """A tool's accepted-and-ignored flags: the hidden typer parameters and the notes."""

    def __init__(self, flags: Iterable[IgnoredFlag]) -> None:
        self.flags = tuple(flags)

    def without(self, declared: Iterable[str]) -> IgnoredFlags:
        """These flags less those a command declares itself (spelled with `-` or `_`)."""
        keys = {_key(name) for name in declared}
        return IgnoredFlags(f for f in self.flags if not keys & {_key(n) for n in f.names})

    def __add__(self, other: IgnoredFlags) -> IgnoredFlags:
        names = [name for flag in self.flags for name in flag.names]
        return IgnoredFlags([*self.flags, *other.without(names).flags])

    @property
    def dests(self) -> set[str]:
        return {flag.dest for flag in self.flags}

    def parameters(self) -> list[inspect.Parameter]:
        return [_hidden_parameter(flag.dest, flag.names, flag.nargs) for flag in self.flags]

    def notes(self, values: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> list:
        """One note per flag given (values by parameter name), in declaration order."""
        environ = os.environ if environ is None else environ
        notes = []
        for flag in self.flags:
            value = values.get(flag.dest)
            if value in (None, False, [], ()):
                continue
            if flag.env is not None and environ.get(flag.env) == str(value):
                continue
            notes.append(flag.note())
        return notes

    def accepting(self, command: Callable) -> Callable:
        """`command` (a typer command function) with these flags added as hidden options, less
        those it declares; each one given is noted once on stderr before it runs."""
        hints = typing.get_type_hints(command, include_extras=True)
        signature = inspect.signature(command)
        flags = self.without(_declared_names(signature, hints))
        extra = flags.parameters()

        @functools.wraps(command)
        def wrapper(**values: Any) -> Any:
            given = {name: values.pop(name) for name in flags.dests}
            for note in flags.notes(given):
                logger.warning("%s", note)
            return command(**values)

        # Annotations resolved here: typer reads a given __signature__ as it is.
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in signature.parameters.values()
        ]
        parameters = [*own, *extra]
        wrapper.__signature__ = signature.replace(parameters=parameters)
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
        del wrapper.__wrapped__  # typer must read the new signature, not the command's
        return wrapper


def _hidden_parameter(dest: str, names: tuple[str, ...], nargs: int) -> inspect.Parameter:
    """A hidden typer option taking `nargs` values as argparse would."""
    if nargs == 0:
        annotation, default = bool, False
    elif nargs == MANY:
        annotation, default = list[str] | None, None
    elif nargs == 1:
        annotation, default = str | None, None
    else:
        annotation, default = tuple[(str,) * nargs] | None, None
    option = typer.Option(*names, hidden=True)
    return inspect.Parameter(
        dest,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[annotation, option],
    )


def _declared_names(signature: inspect.Signature, hints: dict[str, Any]) -> list[str]:
    """Every option spelling a typer command function declares."""
    names = []
    for name in signature.parameters:
        names.append("--" + name.replace("_", "-"))
        for meta in getattr(hints.get(name), "__metadata__", ()):
            names += [d for d in getattr(meta, "param_decls", None) or () if d.startswith("-")]
            if isinstance(getattr(meta, "default", None), str) and meta.default.startswith("-"):
                names.append(meta.default)  # typer.Option("--name", ...): the first declaration
    return names


def _training(names: tuple[str, ...], nargs: int = 1) -> IgnoredFlag:
    return ignored(*names, why="a training flag; the checkpoint gives the model", nargs=nargs)


# pretrain_gpt.py's flags that only matter to training (README of mds-train, "Flags"), as the
# seeds' $GPT_ARGS, $OUTPUT_ARGS and $DATA_ARGS pass them; nargs as Megatron's argparse.
TRAINING_FLAGS = IgnoredFlags(
    [
        *(
            _training((name,))
            for name in (
                "--micro-batch-size",
                "--global-batch-size",
                "--train-iters",
                "--train-samples",
                "--optimizer",
                "--lr",
                "--min-lr",
                "--lr-decay-style",
                "--lr-decay-iters",
                "--lr-decay-samples",
                "--lr-warmup-fraction",
                "--lr-warmup-iters",
                "--lr-warmup-samples",
                "--weight-decay",
                "--clip-grad",
                "--adam-beta1",
                "--adam-beta2",
                "--adam-eps",
                "--sgd-momentum",
                "--loss-scale",
                "--initial-loss-scale",
                "--min-loss-scale",
                "--loss-scale-window",
                "--hysteresis",
                "--seed",
                "--hidden-dropout",
                "--attention-dropout",
                "--init-method-std",
                "--recompute-granularity",
                "--split",
                "--data-cache-path",
                "--save-interval",
                "--log-interval",
                "--eval-interval",
                "--eval-iters",
                "--tensorboard-dir",
                "--tensorboard-queue-size",
                "--tensorboard-log-interval",
                "--exit-interval",
                "--exit-duration-in-mins",
                "--kill-switch-path",
                "--max-nan-iterations",
                "--zero-stage",
                "--distributed-backend",
                "--DDP-impl",
                "--num-workers",
                "--codecarbon-dir",
                "--output-dir",
                "--peak-tflops",
                "--onnx-safe",
            )
        ),
        _training(("--deepspeed_config", "--deepspeed-config")),
        _training(("--rampup-batch-size",), nargs=3),
        _training(("--data-path",), nargs=MANY),
        *(
            _training((name,), nargs=0)
            for name in (
                "--fp16",
                "--bf16",
                "--deepspeed",
                "--checkpoint-activations",
                "--deepspeed-activation-checkpointing",
                "--partition-activations",
                "--eod-mask-loss",
                "--finetune",
                "--log-timers-to-tensorboard",
                "--log-batch-size-to-tensorboard",
                "--log-validation-ppl-to-tensorboard",
                "--sequence-parallel",
                "--no-fused-kernels",
                "--no-masked-softmax-fusion",
                "--no-bias-gelu-fusion",
                "--openai-gelu",
                "--no-bias-dropout-fusion",
                "--use-flash-attn",
                "--grad-reduce-in-bf16",
            )
        ),
        ignored("--data-impl", "--dataset-impl", why="mmap is the only dataset format"),
        ignored("--no-load-optim", why="no optimizer state is loaded here", nargs=0),
        ignored("--no-load-rng", why="no RNG state is loaded here", nargs=0),
        ignored(
            "--local-rank",
            why="one process; launchers' ranks come from the environment",
            env="LOCAL_RANK",
        ),
    ]
)
