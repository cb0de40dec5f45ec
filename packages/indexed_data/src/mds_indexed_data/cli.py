"""`mds-index`: build sample-index caches, merge datasets, inspect them (thin typer app).

Megatron writes `--data-path 0.3 A 0.7 B` and `--datasets P1 P2` (argparse nargs='+'); typer takes
one value per flag, so `main` rewrites those runs into repeated flags before parsing.
"""

import logging
import sys
from typing import Annotated

import typer

from mds_indexed_data.build import build_train_valid_test_datasets, format_summary
from mds_indexed_data.config import GPTDataConfig, samples_from_iterations
from mds_indexed_data.inspection import document_tokens, info_text, make_decoder, render_tokens
from mds_indexed_data.merge import merge_datasets, write_merge_metadata
from mds_indexed_data.reader import IndexedDatasetReader
from mds_indexed_data.split import SPLIT_NAMES

MULTI_VALUE_FLAGS = ("--data-path", "--datasets")

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])


def _sample_counts(
    train_samples,
    valid_samples,
    test_samples,
    train_iters,
    global_batch_size,
    eval_interval,
    eval_iters,
) -> tuple[int, int, int]:
    if (train_samples is None) == (train_iters is None):
        raise ValueError("give exactly one of --train-samples or --train-iters")
    if train_samples is not None:
        if global_batch_size is not None:
            raise ValueError("--global-batch-size goes with --train-iters, not --train-samples")
        return train_samples, valid_samples or 0, test_samples or 0
    if valid_samples is not None or test_samples is not None:
        raise ValueError(
            "--valid-samples/--test-samples go with --train-samples, not --train-iters"
        )
    if global_batch_size is None:
        raise ValueError("--train-iters needs --global-batch-size")
    return samples_from_iterations(
        train_iters=train_iters,
        global_batch_size=global_batch_size,
        eval_interval=eval_interval,
        eval_iters=eval_iters,
    )


DataPath = Annotated[
    list[str], typer.Option(help="One prefix, or weight/prefix pairs: --data-path 0.3 A 0.7 B")
]
Split = Annotated[str, typer.Option(help="Train/valid/test document weights, e.g. '949,50,1'")]
SeqLength = Annotated[int, typer.Option(help="Tokens per sample L (each sample holds L + 1)")]
Seed = Annotated[int, typer.Option(help="numpy RandomState seed, as Megatron's --seed")]
CacheDir = Annotated[
    str | None, typer.Option(help="Where the index caches go (default: next to each dataset)")
]


@app.command()
def build(
    data_path: DataPath,
    seq_length: SeqLength,
    split: Split = "969, 30, 1",
    seed: Seed = 1234,
    train_samples: Annotated[int | None, typer.Option(help="Training samples")] = None,
    valid_samples: Annotated[int | None, typer.Option(help="Validation samples")] = None,
    test_samples: Annotated[int | None, typer.Option(help="Test samples")] = None,
    train_iters: Annotated[int | None, typer.Option(help="Iterations (instead of samples)")] = None,
    global_batch_size: Annotated[int | None, typer.Option(help="Samples per iteration")] = None,
    eval_interval: Annotated[int, typer.Option(help="Iterations between evaluations")] = 1000,
    eval_iters: Annotated[int, typer.Option(help="Iterations per evaluation")] = 100,
    cache_dir: CacheDir = None,
) -> None:
    """Precompute every sample-index cache training needs and print the summary."""
    counts = _sample_counts(
        train_samples,
        valid_samples,
        test_samples,
        train_iters,
        global_batch_size,
        eval_interval,
        eval_iters,
    )
    config = GPTDataConfig.from_data_path(
        data_path,
        seq_length=seq_length,
        num_samples=counts,
        split=split,
        seed=seed,
        cache_dir=cache_dir,
    )
    print(
        "target sizes: " + ", ".join(f"{n} {c}" for n, c in zip(SPLIT_NAMES, counts, strict=True))
    )
    print(format_summary(build_train_valid_test_datasets(config)))


@app.command()
def merge(
    datasets: Annotated[
        list[str], typer.Option(help="Input prefixes, in order: --datasets P1 P2 ...")
    ],
    output_prefix: Annotated[str, typer.Option(help="Output prefix (writes OUT.bin and OUT.idx)")],
) -> None:
    """Concatenate datasets (items, documents and tokens in order; dtypes must match)."""
    merged = merge_datasets(datasets, output_prefix)
    write_merge_metadata(datasets, merged)
    print(
        f"merged {len(datasets)} datasets into {output_prefix}: {merged.num_documents} documents, "
        f"{len(merged)} items, {merged.num_tokens} tokens, {merged.dtype}"
    )


@app.command()
def info(prefix: Annotated[str, typer.Argument(help="Dataset prefix (without .bin/.idx)")]) -> None:
    """Documents, tokens, dtype and the item-length histogram of a dataset."""
    print(info_text(prefix))


@app.command()
def show(
    prefix: Annotated[str, typer.Argument(help="Dataset prefix (without .bin/.idx)")],
    doc: Annotated[int | None, typer.Option(help="Print document i")] = None,
    sample: Annotated[
        int | None, typer.Option(help="Print training sample i (needs a built cache)")
    ] = None,
    split_name: Annotated[str, typer.Option(help="train, valid or test (with --sample)")] = "train",
    seq_length: Annotated[
        int | None, typer.Option(help="As given to build (with --sample)")
    ] = None,
    split: Split = "969, 30, 1",
    seed: Seed = 1234,
    train_samples: Annotated[int, typer.Option(help="As given to build (with --sample)")] = 0,
    valid_samples: Annotated[int, typer.Option(help="As given to build (with --sample)")] = 0,
    test_samples: Annotated[int, typer.Option(help="As given to build (with --sample)")] = 0,
    cache_dir: CacheDir = None,
    vocab_file: Annotated[str | None, typer.Option(help="GPT-2 vocab.json, to print text")] = None,
    merge_file: Annotated[str | None, typer.Option(help="GPT-2 merges.txt, to print text")] = None,
) -> None:
    """Print a document, or a training sample of a built cache, as text or token ids."""
    if (doc is None) == (sample is None):
        raise ValueError("give exactly one of --doc or --sample")
    decoder = make_decoder(vocab_file, merge_file)
    if doc is not None:
        tokens = document_tokens(IndexedDatasetReader(prefix), doc)
    else:
        if seq_length is None:
            raise ValueError("--sample needs --seq-length (and the sample counts given to build)")
        if split_name not in SPLIT_NAMES:
            raise ValueError(f"--split-name {split_name!r}: use one of {', '.join(SPLIT_NAMES)}")
        config = GPTDataConfig(
            prefixes=(prefix,),
            weights=(1.0,),
            seq_length=seq_length,
            num_samples=(train_samples, valid_samples, test_samples),
            split=split,
            seed=seed,
            cache_dir=cache_dir,
        )
        dataset = getattr(
            build_train_valid_test_datasets(config, build_missing=False, split_names=[split_name]),
            split_name,
        )
        if dataset is None:
            raise ValueError(f"--split-name {split_name}: --split {split!r} gives it no documents")
        if not 0 <= sample < len(dataset):
            raise ValueError(
                f"--sample {sample}: the {split_name} split has samples 0..{len(dataset) - 1}"
            )
        tokens = dataset[sample]
    print(render_tokens(tokens, decoder))


def _expand_multi_value_flags(args: list[str]) -> list[str]:
    """`--data-path a b c` -> `--data-path a --data-path b --data-path c` (Megatron's nargs='+')."""
    expanded, current = [], None
    for arg in args:
        if arg.startswith("-"):
            current = arg if arg in MULTI_VALUE_FLAGS else None
            expanded.append(arg)
        elif current is not None and expanded[-1] != current:
            expanded.extend([current, arg])
        else:
            expanded.append(arg)
    return expanded


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    args = _expand_multi_value_flags(list(sys.argv[1:] if argv is None else argv))
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="mds-index", standalone_mode=False)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as error:
        # Usage errors (unknown flag, missing value) print click's usage line and message.
        error.show()
        sys.exit(getattr(error, "exit_code", 2))
    except (ValueError, OSError) as error:
        # IndexedDatasetError is a ValueError: user mistakes end here as one line, no traceback.
        print(f"mds-index: error: {error}", file=sys.stderr)
        sys.exit(1)
    if isinstance(code, int) and code:
        sys.exit(code)
