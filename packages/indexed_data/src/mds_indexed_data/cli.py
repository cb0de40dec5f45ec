"""`mds-index`: build sample-index caches, merge datasets, inspect them (thin typer app).

Megatron's `--data-path 0.3 A 0.7 B` and `--datasets P1 P2` (argparse nargs='+'), negative
numbers and abbreviations are read by the shared dialect (`mds_common.cli`, docs/cli.md). The core
modules are imported inside the commands, so `mds-index --help` does not load numpy.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mds_common.cli import new_app, run_app
from mds_common.flags import command_function, flag, group_from_values, restate
from mds_common.sample_flags import SeqLengthFlags

from mds_indexed_data.flags import DataFlags, LengthFlags, SeedFlags

app = new_app("Build sample-index caches, merge datasets, inspect them (Megatron .bin/.idx).")

_AS_BUILT = "As given to build (with --sample)."


@dataclass(frozen=True, kw_only=True)
class BuildFlags(LengthFlags, SeedFlags, SeqLengthFlags, DataFlags):
    """`mds-index build`: the data flags (mds_indexed_data.flags) and two counts of its own."""

    seq_length: int = restate(
        SeqLengthFlags, "seq_length", required=True, note="A cache's sample holds one more."
    )
    valid_samples: int | None = flag(
        "--valid-samples", help="Validation samples (with --train-samples)."
    )
    test_samples: int | None = flag("--test-samples", help="Test samples (with --train-samples).")

    def sample_counts(self) -> tuple[int, int, int]:
        from mds_indexed_data.config import samples_from_iterations

        if (self.train_samples is None) == (self.train_iters is None):
            raise ValueError("give exactly one of --train-samples or --train-iters")
        if self.train_samples is not None:
            if self.global_batch_size is not None:
                raise ValueError("--global-batch-size goes with --train-iters, not --train-samples")
            return self.train_samples, self.valid_samples or 0, self.test_samples or 0
        if self.valid_samples is not None or self.test_samples is not None:
            raise ValueError(
                "--valid-samples/--test-samples go with --train-samples, not --train-iters"
            )
        if self.global_batch_size is None:
            raise ValueError("--train-iters needs --global-batch-size")
        return samples_from_iterations(
            train_iters=self.train_iters,
            global_batch_size=self.global_batch_size,
            eval_interval=self.eval_interval,
            eval_iters=self.eval_iters,
        )


def _cache_dir(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _build(**values: Any) -> None:
    from mds_indexed_data.build import build_train_valid_test_datasets, format_summary
    from mds_indexed_data.config import GPTDataConfig
    from mds_indexed_data.split import SPLIT_NAMES

    flags = group_from_values(BuildFlags, values)
    counts = flags.sample_counts()
    config = GPTDataConfig.from_data_path(
        flags.data_path,
        seq_length=flags.seq_length,
        num_samples=counts,
        split=flags.split,
        seed=flags.seed,
        cache_dir=_cache_dir(flags.data_cache_path),
    )
    built = build_train_valid_test_datasets(config)
    print(
        "target sizes: " + ", ".join(f"{n} {c}" for n, c in zip(SPLIT_NAMES, counts, strict=True))
    )
    print(format_summary(built))


@dataclass(frozen=True, kw_only=True)
class MergeFlags:
    datasets: tuple[Path, ...] = flag(
        "--datasets",
        multiple=True,
        required=True,
        help="Input prefixes, in order: --datasets P1 P2 ...",
    )
    output_prefix: Path = flag(
        "--output-prefix",
        required=True,
        help="Output prefix (writes OUT.bin, OUT.idx, OUT.merge.json)",
    )


def _merge(**values: Any) -> None:
    from mds_indexed_data.merge import merge_datasets, write_merge_metadata

    flags = group_from_values(MergeFlags, values)
    merged = merge_datasets(list(flags.datasets), flags.output_prefix)
    write_merge_metadata(list(flags.datasets), merged)
    print(
        f"merged {len(flags.datasets)} datasets into {flags.output_prefix}: "
        f"{merged.num_documents} documents, {len(merged)} items, {merged.num_tokens} tokens, "
        f"{merged.dtype}"
    )


@dataclass(frozen=True, kw_only=True)
class PrefixFlags:
    prefix: Path = flag(required=True, help="Dataset prefix (without .bin/.idx)")


def _info(**values: Any) -> None:
    from mds_indexed_data.inspection import info_text

    print(info_text(group_from_values(PrefixFlags, values).prefix))


@dataclass(frozen=True, kw_only=True)
class ShowFlags(PrefixFlags):
    """`mds-index show`: a document, or a sample of a cache built with these data flags."""

    doc: int | None = flag("--doc", help="Print document i")
    sample: int | None = flag("--sample", help="Print training sample i (needs a built cache)")
    split_name: str = flag(
        "--split-name", default="train", help="train, valid or test (with --sample)"
    )
    seq_length: int | None = restate(SeqLengthFlags, "seq_length", note=_AS_BUILT)
    split: str = restate(DataFlags, "split")
    seed: int = restate(SeedFlags, "seed")
    train_samples: int = restate(LengthFlags, "train_samples", default=0, note=_AS_BUILT)
    valid_samples: int = restate(BuildFlags, "valid_samples", default=0, note=_AS_BUILT)
    test_samples: int = restate(BuildFlags, "test_samples", default=0, note=_AS_BUILT)
    data_cache_path: Path | None = restate(DataFlags, "data_cache_path")


def _show(**values: Any) -> None:
    from mds_indexed_data.build import build_train_valid_test_datasets
    from mds_indexed_data.config import GPTDataConfig
    from mds_indexed_data.inspection import document_items, render_lines
    from mds_indexed_data.reader import IndexedDatasetReader
    from mds_indexed_data.split import SPLIT_NAMES

    flags = group_from_values(ShowFlags, values)
    doc, sample, split_name = flags.doc, flags.sample, flags.split_name
    if (doc is None) == (sample is None):
        raise ValueError("give exactly one of --doc or --sample")
    if doc is not None:
        print(render_lines(document_items(IndexedDatasetReader(flags.prefix), doc)))
        return
    if flags.seq_length is None:
        raise ValueError("--sample needs --seq-length (and the sample counts given to build)")
    if split_name not in SPLIT_NAMES:
        raise ValueError(f"--split-name {split_name!r}: use one of {', '.join(SPLIT_NAMES)}")
    config = GPTDataConfig(
        prefixes=(str(flags.prefix),),
        weights=(1.0,),
        seq_length=flags.seq_length,
        num_samples=(flags.train_samples, flags.valid_samples, flags.test_samples),
        split=flags.split,
        seed=flags.seed,
        cache_dir=_cache_dir(flags.data_cache_path),
    )
    dataset = getattr(
        build_train_valid_test_datasets(config, build_missing=False, split_names=[split_name]),
        split_name,
    )
    if dataset is None:
        raise ValueError(
            f"--split-name {split_name}: --split {flags.split!r} gives it no documents"
        )
    if not 0 <= sample < len(dataset):
        raise ValueError(
            f"--sample {sample}: the {split_name} split has samples 0..{len(dataset) - 1}"
        )
    runs = [dataset.reader.get(*span) for span in dataset.sample_spans(sample)]
    print(render_lines(runs))


app.command("build")(
    command_function(
        _build,
        [BuildFlags],
        name="build",
        doc="Precompute every sample-index cache training needs and print the summary.",
    )
)
app.command("merge")(
    command_function(
        _merge,
        [MergeFlags],
        name="merge",
        doc="Concatenate datasets (items, documents and tokens in order; dtypes must match).",
    )
)
app.command("info")(
    command_function(
        _info,
        [PrefixFlags],
        name="info",
        doc="Documents, tokens, dtype and the item-length histogram of a dataset.",
    )
)
app.command("show")(
    command_function(
        _show,
        [ShowFlags],
        name="show",
        doc="Print the token ids of a document (a line per item) or of a training sample of a "
        "built cache (a line per document run); `| mds-tokenize decode` prints them as text.",
    )
)


def main(argv: list[str] | None = None) -> None:
    run_app(app, prog="mds-index", distribution="mds-indexed-data", argv=argv)


if __name__ == "__main__":
    main()
