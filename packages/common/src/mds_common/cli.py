"""The mds command-line dialect (docs/cli.md): every tool's `main()` is `run_app(app, prog=...,
distribution=...)`.

It reads argparse-style (Megatron) command lines through `mds_common.argv`, prints `--version`,
sets up logging on stderr once, and turns every failure into one stderr line
`PROG [SUBCOMMAND]: error: MESSAGE`: exit 2 when the command line cannot be parsed, 1 when the
command ran and failed on its input (a ValueError or OSError from the tool's core), 130 when
interrupted.
"""

import atexit
import difflib
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import typer

from mds_common.argv import HELP, VERSION, ArgvError, looks_like_option, normalise, option_specs
from mds_common.sidecar import distribution_version

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def new_app(help: str, **settings) -> typer.Typer:  # noqa: A002 - typer's own keyword
    """A typer app in the house settings: click's plain help (no rich boxes: `--append-eod`, not
    `--append-eod <bool>`), no shell-completion options, no pretty tracebacks."""
    return typer.Typer(
        help=help,
        add_completion=False,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
        **settings,
    )


def configure_logging(level: int = logging.INFO) -> None:
    """Logs and progress go to stderr as bare messages; set up once per command (a second call,
    or one after the tool configured logging itself, changes nothing)."""
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)


@dataclass
class _Invocation:
    words: list[str]  # what the user typed to name the command: ["mds-tokenize", "learn"]
    args: list[str]  # the argv handed to the root click command


class _Usage(Exception):
    """A usage error found before click parses; `show_help` prints the command's help first."""

    def __init__(self, message: str, *, show_help: bool = False):
        super().__init__(message)
        self.show_help = show_help


def _resolve(root, argv: list[str], prog: str, default_command: str | None) -> _Invocation:
    """Walks subcommands from the root, then normalises the leaf command's own tokens."""
    words, command, args, tokens = [prog], root, [], list(argv)
    while hasattr(command, "commands"):
        if not tokens:
            raise _Usage("", show_help=True)
        head = tokens[0]
        if head in command.commands:
            words.append(head)
            args.append(head)
            command = command.commands[head]
            tokens = tokens[1:]
            continue
        if head in (HELP, "-h"):
            return _Invocation(words, [*args, HELP])
        if head == VERSION:
            return _Invocation(words, [VERSION])
        default = command.commands.get(default_command) if command is root else None
        takes_arguments = default is not None and any(
            param.param_type_name == "argument" for param in default.params
        )
        if default is not None and (looks_like_option(head) or takes_arguments):
            args.append(default_command)
            command = default
            continue
        names = sorted(command.commands)
        if looks_like_option(head):
            raise _Usage(f"no such option: {head}; give a command first: {', '.join(names)}")
        close = difflib.get_close_matches(head, names, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else f"; the commands: {', '.join(names)}"
        raise _Usage(f"no such command: {head}{hint}")
    if not tokens and any(param.required for param in command.params):
        raise _Usage("", show_help=True)
    try:
        normalised = normalise(tokens, option_specs(command))
    except ArgvError as error:
        raise _Usage(str(error)) from None
    if normalised.wants_version:
        return _Invocation(words, [VERSION])
    return _Invocation(words, [*args, *normalised.args])


def _error_message(error: BaseException) -> str:
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    if isinstance(error, typer.TyperException) and hasattr(error, "format_message"):
        return error.format_message()
    return str(error)


def _help_text(root, invocation_words: list[str], prog: str) -> str:
    """The help of the command named by `invocation_words` (the root's when it names none)."""
    command, context = root, root.make_context(prog, [], resilient_parsing=True)
    for name in invocation_words[1:]:
        command = command.commands[name]
        context = command.make_context(name, [], parent=context, resilient_parsing=True)
    return command.get_help(context)


def run_app(
    app,
    *,
    prog: str,
    distribution: str,
    argv: list[str] | None = None,
    default_command: str | None = None,
) -> NoReturn:
    """Runs a typer app (or the click command of one) as the tool `prog` and exits.

    `distribution` names the installed distribution whose version `--version` prints.
    `default_command` is the subcommand that runs when the first token names none
    (`mds-tokenize --input ...` is `mds-tokenize encode --input ...`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    root = typer.main.get_command(app) if isinstance(app, typer.Typer) else app
    configure_logging()
    try:
        invocation = _resolve(root, argv, prog, default_command)
    except _Usage as usage:
        if usage.show_help:
            # A bare command: its help, on stderr (nothing was asked for), as a usage error.
            sys.stderr.write(_help_text(root, _typed_words(root, argv, prog), prog) + "\n")
            sys.exit(EXIT_USAGE)
        _fail(" ".join(_typed_words(root, argv, prog)), str(usage), EXIT_USAGE)
    prefix = " ".join(invocation.words)
    if invocation.args[-1:] == [VERSION]:
        print(f"{prog} {distribution_version(distribution)}")
        sys.exit(EXIT_OK)
    try:
        result = root.main(args=invocation.args, prog_name=prog, standalone_mode=False)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _fail(prefix, "interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader of stdout went away (`| head`): stop quietly, as shell tools do.
        sys.stderr.close()
        sys.exit(EXIT_FAILED)
    except typer.TyperException as error:  # click's UsageError and friends
        _fail(prefix, _error_message(error), getattr(error, "exit_code", EXIT_USAGE))
    except (ValueError, OSError) as error:
        _fail(prefix, _error_message(error), EXIT_FAILED)
    sys.exit(result if isinstance(result, int) else EXIT_OK)


def _typed_words(root, argv: list[str], prog: str) -> list[str]:
    words, command = [prog], root
    for token in argv:
        if token not in getattr(command, "commands", {}):
            break
        words.append(token)
        command = command.commands[token]
    return words


def _fail(prefix: str, message: str, code: int) -> NoReturn:
    # One line: a multi-line message (click's, or a tool's) is folded.
    line = " ".join(message.split()) if "\n" in message else message
    sys.stderr.write(f"{prefix}: error: {line}\n")
    sys.exit(code)


def run_then_exit(main: Callable[[], object]) -> NoReturn:
    """A tool's console script: `main()`, then the process ends without tearing the interpreter
    down.

    Tearing down an interpreter that imported torch (clearing thousands of modules, collecting
    their objects) takes 0.5-2 s on a small VM and does nothing a finished command needs: its
    output files are written, fsynced and renamed inside `main()`. What the interpreter's exit
    does first still happens, in its order: non-daemon threads are joined (after threading's own
    exit hooks, which stop thread pools), the exit functions run (logging's flush,
    multiprocessing's children), and the standard streams are flushed. In-process callers
    (tests) call `main()`, which returns or raises as usual; an exception other than SystemExit
    leaves through the interpreter's own exit, traceback and all."""
    try:
        main()
    except SystemExit as exit_:
        if exit_.code is not None and not isinstance(exit_.code, int):
            raise  # a message to print: the interpreter's own exit does that
        code = exit_.code or 0
    else:
        code = 0
    threading._shutdown()  # noqa: SLF001 - what Py_FinalizeEx runs first
    atexit._run_exitfuncs()  # noqa: SLF001 - what it runs next
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe, as at a normal exit
            pass
    os._exit(code)
