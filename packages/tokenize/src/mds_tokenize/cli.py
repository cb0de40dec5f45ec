"""`mds-tokenize`: the typer app. Plain `mds-tokenize --input ...` runs `encode`; `merge` joins
partition shards; `learn` trains a vocabulary (learn_cli.py).

Accepts Megatron's `preprocess_data.py` spellings (README: "Megatron's flags"): `--vocab`,
`--tokenizer-type GPT2BPETokenizer`, `--dataset-impl mmap`, `--log-interval`, `--json-keys a b`.
"""

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from mds_indexed_data import IndexedDatasetError

from mds_tokenize.learn_cli import learn

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="GPT-2 byte-level BPE: jsonl -> Megatron .bin/.idx (encode, the default), merge "
    "shards, learn.",
)
SUBCOMMANDS = ("encode", "merge", "learn")
# Flags that take several values argparse-style (`--input a b`), as the Megatron tools spell them.
MULTI_VALUE_FLAGS = {
    "encode": ("--json-keys",),
    "merge": ("--json-keys",),
    "learn": ("--input", "--json-keys", "--special-tokens"),
}
# typer vendors its own click; its UsageError (missing flag, bad value, unknown option) is the
# base class of the public typer.BadParameter.
_USAGE_ERROR = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "UsageError")


def _fail(command: str, error: Exception) -> None:
    typer.echo(f"{command}: error: {error}", err=True)
    raise typer.Exit(code=1)


@app.command("encode")
def encode(
    input: Annotated[
        Path,
        typer.Option(
            "--input",
            help="jsonl file, one JSON object per line; .gz/.xz/.zst are decompressed by "
            "extension.",
        ),
    ],  # noqa: A002
    output_prefix: Annotated[
        str,
        typer.Option(
            "--output-prefix", help="Writes {prefix}_{key}_document.bin/.idx per JSON key."
        ),
    ],
    vocab_file: Annotated[
        Path, typer.Option("--vocab-file", "--vocab", help="GPT-2 vocab.json (token -> id).")
    ],
    merge_file: Annotated[
        Path,
        typer.Option(
            "--merge-file", help="GPT-2 merges.txt ('#version' header, one pair per line)."
        ),
    ],
    json_keys: Annotated[
        list[str],
        typer.Option(
            "--json-keys", help="Keys to tokenize, one dataset each: --json-keys text title."
        ),
    ] = ["text"],  # noqa: B006
    append_eod: Annotated[
        bool, typer.Option("--append-eod", help="Append <|endoftext|> to every non-empty document.")
    ] = False,
    workers: Annotated[
        int,
        typer.Option("--workers", help="Encoding processes; output is identical for any number."),
    ] = 1,
    partition: Annotated[
        str | None,
        typer.Option(
            "--partition",
            help="K/N, K 0-based: tokenize only the K-th of N byte ranges "
            "(e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); join with `mds-tokenize merge`.",
        ),
    ] = None,
    skip_bad_lines: Annotated[
        bool,
        typer.Option(
            "--skip-bad-lines",
            help="Skip and count malformed lines instead of stopping at the first.",
        ),
    ] = False,
    log_interval: Annotated[
        int | None,
        typer.Option(
            "--log-interval",
            help="Without a terminal, log progress every N documents [default: every 10 s].",
        ),
    ] = None,
    tokenizer_type: Annotated[
        str,
        typer.Option(
            "--tokenizer-type",
            help="Only GPT2BPETokenizer (accepted for preprocess_data.py command lines).",
        ),
    ] = "GPT2BPETokenizer",
    dataset_impl: Annotated[
        str,
        typer.Option(
            "--dataset-impl", help="Only mmap (accepted for preprocess_data.py command lines)."
        ),
    ] = "mmap",
) -> None:
    """Tokenize a jsonl corpus into Megatron-compatible .bin/.idx datasets (preprocess_data.py)."""
    from mds_tokenize.config import TokenizeConfig, parse_partition
    from mds_tokenize.pipeline import run

    try:
        if tokenizer_type != "GPT2BPETokenizer":
            raise ValueError(
                f"--tokenizer-type {tokenizer_type}: only GPT2BPETokenizer is supported"
            )
        if dataset_impl != "mmap":
            raise ValueError(
                f"--dataset-impl {dataset_impl}: only mmap is supported (Megatron's default)"
            )
        config = TokenizeConfig(
            input=input,
            output_prefix=output_prefix,
            vocab_file=vocab_file,
            merge_file=merge_file,
            json_keys=tuple(json_keys),
            append_eod=append_eod,
            workers=workers,
            partition=None if partition is None else parse_partition(partition),
            skip_bad_lines=skip_bad_lines,
            log_interval=log_interval,
        )
        run(config)
    except (ValueError, IndexedDatasetError, OSError) as error:
        _fail("mds-tokenize", error)


@app.command("merge")
def merge(
    output_prefix: Annotated[
        str,
        typer.Option(
            "--output-prefix",
            help="The --output-prefix the partitioned runs used; writes "
            "{prefix}_{key}_document.bin/.idx.",
        ),
    ],
    json_keys: Annotated[
        list[str], typer.Option("--json-keys", help="Keys whose shards to merge.")
    ] = ["text"],  # noqa: B006
    keep_parts: Annotated[
        bool, typer.Option("--keep-parts", help="Keep the shard files after merging.")
    ] = False,
) -> None:
    """Join the shards of `--partition K/N` runs, in K order, into one dataset per key."""
    from mds_tokenize.config import MergeConfig
    from mds_tokenize.partitions import merge as merge_shards

    try:
        merge_shards(
            MergeConfig(
                output_prefix=output_prefix, json_keys=tuple(json_keys), keep_parts=keep_parts
            )
        )
    except (ValueError, IndexedDatasetError, OSError) as error:
        _fail("mds-tokenize merge", error)


app.command("learn")(learn)


def _expand_multi_value(argv: list[str], flag: str) -> list[str]:
    """argparse's nargs='+' (`--json-keys a b`) as typer's repeated option
    (`--json-keys a --json-keys b`)."""
    expanded, index = [], 0
    while index < len(argv):
        expanded.append(argv[index])
        if argv[index] == flag:
            values = []
            index += 1
            while index < len(argv) and not argv[index].startswith("-"):
                values.append(argv[index])
                index += 1
            expanded.extend(values[:1])
            for value in values[1:]:
                expanded.extend([flag, value])
            continue
        index += 1
    return expanded


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("--help", "-h"):
        argv = ["encode", *argv]
    for flag in MULTI_VALUE_FLAGS.get(argv[0] if argv else "", ()):
        argv = _expand_multi_value(argv, flag)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        code = app(args=argv, prog_name="mds-tokenize", standalone_mode=False)
    except _USAGE_ERROR as error:
        # One line instead of typer's framed box: a missing flag or a bad value is a user mistake.
        command = "mds-tokenize" + (f" {argv[0]}" if argv and argv[0] in SUBCOMMANDS else "")
        typer.echo(f"{command}: error: {error.format_message()} (see {command} --help)", err=True)
        sys.exit(2)
    except typer.Abort:
        typer.echo("mds-tokenize: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
