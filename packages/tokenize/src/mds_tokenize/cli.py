"""`mds-tokenize`: the typer app. Plain `mds-tokenize --input ...` runs `encode`; `merge` joins
partition shards; `learn` trains a vocabulary (learn/cli.py); `decode` turns ids back into text.

Accepts Megatron's `preprocess_data.py` spellings (README: "Megatron's flags"): `--vocab`,
`--tokenizer-type GPT2BPETokenizer`, `--dataset-impl mmap`, `--log-interval`, `--json-keys a b`.
Parsing, errors and exit codes follow the shared dialect (`mds_common.cli`, docs/cli.md).
"""

import sys
from pathlib import Path
from typing import Annotated

import typer
from mds_common.cli import new_app, run_app

from mds_tokenize.flags import (
    EodToken,
    MergeFile,
    TokenizerNameOrPath,
    TokenizerType,
    VocabFile,
    tokenizer_spec,
)
from mds_tokenize.interface import GPT2_BPE
from mds_tokenize.learn.cli import learn

app = new_app(
    "jsonl -> Megatron .bin/.idx with GPT-2 byte-level BPE or any Hugging Face tokenizer "
    "(encode, the default), merge shards, learn a vocabulary, decode ids."
)


@app.command("encode")
def encode(
    input: Annotated[  # noqa: A002 - Megatron's flag name
        Path,
        typer.Option(
            "--input",
            help="jsonl file, one JSON object per line; .gz/.xz/.zst are decompressed by "
            "extension.",
        ),
    ],
    # A prefix, not a path: Megatron appends to the string as given (Path would drop a final "/").
    output_prefix: Annotated[
        str,
        typer.Option(
            "--output-prefix", help="Writes {prefix}_{key}_document.bin/.idx per JSON key."
        ),
    ],
    vocab_file: VocabFile = None,
    merge_file: MergeFile = None,
    tokenizer_type: TokenizerType = GPT2_BPE,
    tokenizer_name_or_path: TokenizerNameOrPath = None,
    eod_token: EodToken = None,
    json_keys: Annotated[
        list[str],
        typer.Option(
            "--json-keys", help="Keys to tokenize, one dataset each: --json-keys text title."
        ),
    ] = ["text"],  # noqa: B006 - typer reads the default, nothing mutates it
    append_eod: Annotated[
        bool,
        typer.Option(
            "--append-eod", help="Append the EOD (<|endoftext|>) to every non-empty document."
        ),
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

    spec = tokenizer_spec(tokenizer_type, vocab_file, merge_file, tokenizer_name_or_path, eod_token)
    if dataset_impl != "mmap":
        raise ValueError(
            f"--dataset-impl {dataset_impl}: only mmap is supported (Megatron's default)"
        )
    config = TokenizeConfig(
        input=input,
        output_prefix=output_prefix,
        vocab_file=spec.vocab_file,
        merge_file=spec.merge_file,
        tokenizer_type=spec.tokenizer_type,
        tokenizer_name_or_path=spec.tokenizer_name_or_path,
        eod_token=spec.eod_token,
        json_keys=tuple(json_keys),
        append_eod=append_eod,
        workers=workers,
        partition=None if partition is None else parse_partition(partition),
        skip_bad_lines=skip_bad_lines,
        log_interval=log_interval,
    )
    run(config)


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
    ] = ["text"],  # noqa: B006 - typer reads the default, nothing mutates it
    keep_parts: Annotated[
        bool, typer.Option("--keep-parts", help="Keep the shard files after merging.")
    ] = False,
) -> None:
    """Join the shards of `--partition K/N` runs, in K order, into one dataset per key."""
    from mds_tokenize.config import MergeConfig
    from mds_tokenize.partitions import merge as merge_shards

    merge_shards(
        MergeConfig(output_prefix=output_prefix, json_keys=tuple(json_keys), keep_parts=keep_parts)
    )


app.command("learn")(learn)


@app.command("decode")
def decode(
    ctx: typer.Context,
    ids: Annotated[
        list[str] | None,
        typer.Argument(help="Token ids to decode; without them, each line of stdin is decoded."),
    ] = None,
    vocab_file: VocabFile = None,
    merge_file: MergeFile = None,
    tokenizer_type: TokenizerType = GPT2_BPE,
    tokenizer_name_or_path: TokenizerNameOrPath = None,
    eod_token: EodToken = None,
) -> None:
    """Print the text of token ids: one line per line of ids (`mds-index show ... | decode`)."""
    from mds_tokenize.decoding import decode_lines
    from mds_tokenize.interface import load_tokenizer

    if not ids and vocab_file is merge_file is tokenizer_name_or_path is None:
        # A bare `mds-tokenize decode`: its help on stderr, as for every command (docs/cli.md);
        # no flag is required by itself, so the dialect's own check does not see it.
        typer.echo(ctx.get_help(), err=True)
        raise typer.Exit(2)
    spec = tokenizer_spec(tokenizer_type, vocab_file, merge_file, tokenizer_name_or_path, eod_token)
    tokenizer = load_tokenizer(spec)
    if ids:
        lines, source = [" ".join(ids)], "ids"
    else:
        lines, source = sys.stdin, "stdin"
    for text in decode_lines(tokenizer, lines, source=source):
        sys.stdout.write(text + "\n")


def main(argv: list[str] | None = None) -> None:
    run_app(
        app, prog="mds-tokenize", distribution="mds-tokenize", argv=argv, default_command="encode"
    )


if __name__ == "__main__":
    main()
