"""`mds-index`: build sample-index caches, merge datasets, inspect them (thin typer app).

Megatron's `--data-path 0.3 A 0.7 B` and `--datasets P1 P2` (argparse nargs='+'), negative
numbers and abbreviations are read by the shared dialect (`mds_common.cli`, docs/cli.md). The core
modules are imported inside the commands, so `mds-index --help` does not load numpy.
"""

from pathlib import Path
from typing import Annotated

import typer
from mds_common.cli import new_app, run_app

app = new_app("Build sample-index caches, merge datasets, inspect them (Megatron .bin/.idx).")


def _sample_counts(
    train_samples,
    valid_samples,
    test_samples,
    train_iters,
    global_batch_size,
    eval_interval,
    eval_iters,
) -> tuple[int, int, int]:
    from mds_indexed_data.config import samples_from_iterations

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
Prefix = Annotated[Path, typer.Argument(help="Dataset prefix (without .bin/.idx)")]
Split = Annotated[str, typer.Option(help="Train/valid/test document weights, e.g. '949,50,1'")]
SeqLength = Annotated[int, typer.Option(help="Tokens per sample L (each sample holds L + 1)")]
Seed = Annotated[int, typer.Option(help="numpy RandomState seed, as Megatron's --seed")]
CacheDir = Annotated[
    Path | None, typer.Option(help="Where the index caches go (default: next to each dataset)")
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
    from mds_indexed_data.build import build_train_valid_test_datasets, format_summary
    from mds_indexed_data.config import GPTDataConfig
    from mds_indexed_data.split import SPLIT_NAMES

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
        cache_dir=None if cache_dir is None else str(cache_dir),
    )
    built = build_train_valid_test_datasets(config)
    print(
        "target sizes: " + ", ".join(f"{n} {c}" for n, c in zip(SPLIT_NAMES, counts, strict=True))
    )
    print(format_summary(built))


@app.command()
def merge(
    datasets: Annotated[
        list[Path], typer.Option(help="Input prefixes, in order: --datasets P1 P2 ...")
    ],
    output_prefix: Annotated[
        Path, typer.Option(help="Output prefix (writes OUT.bin, OUT.idx, OUT.merge.json)")
    ],
) -> None:
    """Concatenate datasets (items, documents and tokens in order; dtypes must match)."""
    from mds_indexed_data.merge import merge_datasets, write_merge_metadata

    merged = merge_datasets(datasets, output_prefix)
    write_merge_metadata(datasets, merged)
    print(
        f"merged {len(datasets)} datasets into {output_prefix}: {merged.num_documents} documents, "
        f"{len(merged)} items, {merged.num_tokens} tokens, {merged.dtype}"
    )


@app.command()
def info(prefix: Prefix) -> None:
    """Documents, tokens, dtype and the item-length histogram of a dataset."""
    from mds_indexed_data.inspection import info_text

    print(info_text(prefix))


@app.command()
def show(
    prefix: Prefix,
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
) -> None:
    """Print the token ids of a document (a line per item) or of a training sample of a built
    cache (a line per document run); `| mds-tokenize decode` prints them as text."""
    from mds_indexed_data.build import build_train_valid_test_datasets
    from mds_indexed_data.config import GPTDataConfig
    from mds_indexed_data.inspection import document_items, render_lines
    from mds_indexed_data.reader import IndexedDatasetReader
    from mds_indexed_data.split import SPLIT_NAMES

    if (doc is None) == (sample is None):
        raise ValueError("give exactly one of --doc or --sample")
    if doc is not None:
        print(render_lines(document_items(IndexedDatasetReader(prefix), doc)))
        return
    if seq_length is None:
        raise ValueError("--sample needs --seq-length (and the sample counts given to build)")
    if split_name not in SPLIT_NAMES:
        raise ValueError(f"--split-name {split_name!r}: use one of {', '.join(SPLIT_NAMES)}")
    config = GPTDataConfig(
        prefixes=(str(prefix),),
        weights=(1.0,),
        seq_length=seq_length,
        num_samples=(train_samples, valid_samples, test_samples),
        split=split,
        seed=seed,
        cache_dir=None if cache_dir is None else str(cache_dir),
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
    runs = [dataset.reader.get(*span) for span in dataset.sample_spans(sample)]
    print(render_lines(runs))


def main(argv: list[str] | None = None) -> None:
    run_app(app, prog="mds-index", distribution="mds-indexed-data", argv=argv)


if __name__ == "__main__":
    main()
