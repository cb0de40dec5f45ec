"""`mds-tokenize`: the typer app. Plain `mds-tokenize --input ...` runs `encode`; `merge` joins
partition shards; `learn` trains a vocabulary (learn/cli.py); `decode` turns ids back into text.

Accepts Megatron's `preprocess_data.py` spellings (README: "Megatron's flags"): `--vocab`,
`--tokenizer-type GPT2BPETokenizer`, `--dataset-impl mmap`, `--log-interval`, `--json-keys a b`.
Parsing, errors and exit codes follow the shared dialect (`mds_common.cli`, docs/cli.md).
"""

import inspect
import sys
from dataclasses import dataclass
from typing import Any

import typer
from mds_common.cli import new_app, run_app
from mds_common.flags import command_function, flag, group_from_values

from mds_tokenize.config import MergeConfig, TokenizeConfig
from mds_tokenize.flags import TokenizerFlags, tokenizer_spec
from mds_tokenize.learn.cli import learn

app = new_app(
    "jsonl -> Megatron .bin/.idx with GPT-2 byte-level BPE, any Hugging Face tokenizer or a "
    "SentencePiece model "
    "(encode, the default), merge shards, learn a vocabulary, decode ids."
)


@dataclass(frozen=True, kw_only=True)
class DatasetImpl:
    """preprocess_data.py's `--dataset-impl`, accepted for its command lines: mmap only."""

    dataset_impl: str = flag(
        "--dataset-impl",
        default="mmap",
        help="Only mmap (accepted for preprocess_data.py command lines).",
    )


@dataclass(frozen=True, kw_only=True)
class UpstreamSeqLength:
    """deepspeedai's `--seq-length`, which its preprocess_data.py needs with HFTokenizer (it sets
    transformers' `model_max_length`, for a warning only): accepted, the ids do not depend on it."""

    seq_length: int | None = flag(
        "--seq-length",
        help="Accepted for deepspeedai's HFTokenizer command lines; the ids do not depend on it.",
    )


def _encode(**values: Any) -> None:
    from mds_tokenize.pipeline import run

    tokenizer_spec(group_from_values(TokenizerFlags, values))  # a usage error first (exit 2)
    dataset_impl = group_from_values(DatasetImpl, values).dataset_impl
    if dataset_impl != "mmap":
        raise ValueError(
            f"--dataset-impl {dataset_impl}: only mmap is supported (Megatron's default)"
        )
    run(group_from_values(TokenizeConfig, values))


def _merge(**values: Any) -> None:
    from mds_tokenize.partitions import merge as merge_shards

    merge_shards(group_from_values(MergeConfig, values))


app.command("encode")(
    command_function(
        _encode,
        [TokenizeConfig, DatasetImpl, UpstreamSeqLength],
        name="encode",
        doc="Tokenize a jsonl corpus into Megatron-compatible .bin/.idx datasets "
        "(preprocess_data.py).",
    )
)
app.command("merge")(
    command_function(
        _merge,
        [MergeConfig],
        name="merge",
        doc="Join the shards of `--partition K/N` runs, in K order, into one dataset per key.",
    )
)
app.command("learn")(learn)


@dataclass(frozen=True, kw_only=True)
class DecodeFlags(TokenizerFlags):
    ids: tuple[str, ...] = flag(
        multiple=True,
        help="Token ids to decode; without them, each line of stdin is decoded.",
    )


def _decode(ctx: typer.Context, **values: Any) -> None:
    from mds_tokenize.decoding import decode_lines
    from mds_tokenize.interface import load_tokenizer

    flags = group_from_values(DecodeFlags, values)
    if not flags.ids and not flags.names_files:
        # A bare `mds-tokenize decode`: its help on stderr, as for every command (docs/cli.md);
        # no flag is required by itself, so the dialect's own check does not see it.
        typer.echo(ctx.get_help(), err=True)
        raise typer.Exit(2)
    tokenizer = load_tokenizer(tokenizer_spec(flags))
    if flags.ids:
        lines, source = [" ".join(flags.ids)], "ids"
    else:
        lines, source = sys.stdin, "stdin"
    for text in decode_lines(tokenizer, lines, source=source):
        sys.stdout.write(text + "\n")


app.command("decode")(
    command_function(
        _decode,
        [DecodeFlags],
        name="decode",
        doc="Print the text of token ids: one line per line of ids (`mds-index show ... | "
        "decode`).",
        before=[inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)],
    )
)


def main(argv: list[str] | None = None) -> None:
    run_app(
        app, prog="mds-tokenize", distribution="mds-tokenize", argv=argv, default_command="encode"
    )


if __name__ == "__main__":
    main()
