"""`build_train_valid_test_datasets(config)`: the Python API of mds-index used by mds-train.

Follows bigscience's `build_train_valid_test_datasets` (one prefix: a GPTDataset per split; several:
each component split on its own, n_i = ceil(n * w_i * 1.005), then blended). Index arrays come from
the cache when a complete matching one exists (no build at all), else are built and cached; with
`build_missing=False` a miss is an error, for ranks that wait on rank 0 or an offline build.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mds_indexed_data.blending import BlendedDataset, component_num_samples, normalized_weights
from mds_indexed_data.cache import CacheKey, cache_paths, load_cache, save_cache, sizes_digest
from mds_indexed_data.config import SEPARATE_LAST_EPOCH_CUTOFF, GPTDataConfig
from mds_indexed_data.gpt_dataset import GPTDataset
from mds_indexed_data.reader import IndexedDatasetReader
from mds_indexed_data.sample_index import build_index_mappings
from mds_indexed_data.split import SPLIT_NAMES, split_document_ranges

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitSummary:
    """One (dataset prefix, split) pair."""

    prefix: str
    split_name: str
    document_range: tuple[int, int]
    num_tokens: int
    num_samples_requested: int
    num_samples_available: int
    num_epochs: int
    separate_last_epoch: bool
    cache_file: str
    cache_hit: bool

    @property
    def num_documents(self) -> int:
        return self.document_range[1] - self.document_range[0]


@dataclass(frozen=True)
class BlendSummary:
    split_name: str
    input_weights: list[float]
    achieved_ratios: list[float]
    size: int


@dataclass
class DatasetsBuild:
    """The three datasets (None where a split has no documents and nothing was requested)."""

    train: GPTDataset | BlendedDataset | None
    valid: GPTDataset | BlendedDataset | None
    test: GPTDataset | BlendedDataset | None
    splits: list[SplitSummary] = field(default_factory=list)
    blends: list[BlendSummary] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # skip_empty_eval_splits' warning lines


def build_train_valid_test_datasets(
    config: GPTDataConfig,
    *,
    build_missing: bool = True,
    split_names: Sequence[str] = SPLIT_NAMES,
    skip_empty_eval_splits: bool = False,
) -> DatasetsBuild:
    """Opens every dataset, loads or builds each split's index cache, and blends components.

    Splits not in `split_names` are left None and untouched (e.g. a trainer that never tests).
    A valid or test split that `--split` leaves without documents is an error when samples are
    requested from it, unless `skip_empty_eval_splits`: then, as Megatron's
    `build_train_valid_test_datasets` does, that dataset (or blend component) is None, and
    `skipped` says so in a line for the caller to warn with.
    """
    unknown = set(split_names) - set(SPLIT_NAMES)
    if unknown:
        raise ValueError(f"unknown split names {sorted(unknown)}; use {', '.join(SPLIT_NAMES)}")
    weights = normalized_weights(config.weights)
    blended = config.blend
    counts = (
        component_num_samples(weights, config.num_samples)
        if blended
        else [list(config.num_samples)]
    )
    per_split: list[list[tuple[GPTDataset, float]]] = [[], [], []]
    result = DatasetsBuild(train=None, valid=None, test=None)
    for prefix, weight, prefix_counts in zip(config.prefixes, weights, counts, strict=True):
        reader = IndexedDatasetReader(prefix)
        ranges = split_document_ranges(config.split, len(reader))
        for k, (split_name, document_range) in enumerate(zip(SPLIT_NAMES, ranges, strict=True)):
            if split_name not in split_names:
                continue
            if document_range[0] == document_range[1]:
                if config.num_samples[k] > 0 and skip_empty_eval_splits and split_name != "train":
                    result.skipped.append(
                        f"{prefix}: --split {config.split!r} leaves 0 of its {len(reader)} "
                        f"documents for {split_name}; no {split_name} samples from it (as "
                        "Megatron-DeepSpeed)"
                    )
                elif config.num_samples[k] > 0:
                    raise ValueError(
                        f"{prefix}: --split {config.split!r} leaves 0 of its {len(reader)} "
                        f"documents for {split_name}, but {config.num_samples[k]} {split_name} "
                        f"samples are requested; change --split or request 0 {split_name} samples"
                    )
                continue
            dataset, summary = _split_dataset(
                config, reader, split_name, document_range, prefix_counts[k], build_missing
            )
            per_split[k].append((dataset, weight))
            result.splits.append(summary)
    for k, split_name in enumerate(SPLIT_NAMES):
        if not per_split[k]:
            continue
        if not blended:
            setattr(result, split_name, per_split[k][0][0])
            continue
        datasets = [dataset for dataset, _ in per_split[k]]
        split_weights = [weight for _, weight in per_split[k]]
        blend = BlendedDataset(name=split_name, datasets=datasets, weights=split_weights)
        setattr(result, split_name, blend)
        result.blends.append(
            BlendSummary(split_name, split_weights, blend.achieved_ratios(), len(blend))
        )
    return result


def _split_dataset(
    config: GPTDataConfig,
    reader: IndexedDatasetReader,
    split_name: str,
    document_range: tuple[int, int],
    num_samples: int,
    build_missing: bool,
) -> tuple[GPTDataset, SplitSummary]:
    num_tokens = int(reader.sizes[document_range[0] : document_range[1]].sum(dtype="int64"))
    if num_tokens == 0:
        raise ValueError(
            f"{reader.prefix}: the {split_name} documents "
            f"[{document_range[0]}, {document_range[1]}) hold no tokens; change --split or "
            "re-tokenize the data"
        )
    key = CacheKey(
        data_prefix=reader.prefix,
        split_name=split_name,
        document_range=document_range,
        sizes_digest=sizes_digest(reader.sizes, document_range),
        num_samples=num_samples,
        seq_length=config.seq_length,
        seed=config.seed,
        cutoff=SEPARATE_LAST_EPOCH_CUTOFF,
    )
    cache_dir = config.cache_dir_for(reader.prefix)
    cached = load_cache(key, cache_dir)
    hit = cached is not None
    if hit:
        mappings, _ = cached
    elif not build_missing:
        raise ValueError(
            f"{cache_paths(key, cache_dir)['json']}: no complete sample-index cache for "
            f"{reader.prefix} ({split_name}); build it first (rank 0, or `mds-index build` with "
            "the same flags)"
        )
    else:
        logger.info(
            "building %s indices of %s (%d samples)", split_name, reader.prefix, num_samples
        )
        built = build_index_mappings(
            sizes=reader.sizes,
            document_range=document_range,
            num_samples=num_samples,
            seq_length=config.seq_length,
            seed=config.seed,
            cutoff=SEPARATE_LAST_EPOCH_CUTOFF,
        )
        extra = {"num_tokens_per_epoch": num_tokens}
        try:
            save_cache(key, cache_dir, built, extra)
        except OSError as error:
            raise ValueError(
                f"{cache_dir}: cannot write the sample-index cache ({error.strerror or error}); "
                "pass --cache-dir to a writable folder"
            ) from None
        # Reload through the cache so callers always see read-only mapped arrays; if another
        # process removed the files meanwhile, the arrays just built are as good.
        reloaded = load_cache(key, cache_dir)
        mappings = reloaded[0] if reloaded is not None else built
    files = cache_paths(key, cache_dir)
    dataset = GPTDataset(
        name=split_name,
        reader=reader,
        mappings=mappings,
        document_range=document_range,
        num_samples_requested=num_samples,
        cache_files=files,
    )
    summary = SplitSummary(
        prefix=reader.prefix,
        split_name=split_name,
        document_range=document_range,
        num_tokens=num_tokens,
        num_samples_requested=num_samples,
        num_samples_available=len(dataset),
        num_epochs=mappings.num_epochs,
        separate_last_epoch=mappings.separate_last_epoch,
        cache_file=str(files["json"]),
        cache_hit=hit,
    )
    return dataset, summary


def format_summary(build: DatasetsBuild) -> str:
    """Readable lines: documents, epochs and samples per split, then the achieved blend ratios."""
    lines = []
    for s in build.splits:
        lines.append(
            f"{s.split_name:5} {s.prefix}: documents "
            f"[{s.document_range[0]}, {s.document_range[1]}) = {s.num_documents}, "
            f"tokens {s.num_tokens}, epochs {s.num_epochs}"
            f"{' (last epoch shuffled separately)' if s.separate_last_epoch else ''}, "
            f"samples requested {s.num_samples_requested} available {s.num_samples_available}, "
            f"cache {'hit' if s.cache_hit else 'built'} {Path(s.cache_file).name}"
        )
    for blend in build.blends:
        lines.append(
            f"{blend.split_name} blend of {len(blend.input_weights)} datasets, "
            f"{blend.size} samples:"
        )
        for i, (weight, ratio) in enumerate(
            zip(blend.input_weights, blend.achieved_ratios, strict=True)
        ):
            lines.append(f"   dataset {i}, input: {weight:.6g}, achieved: {ratio:.6g}")
    return "\n".join(lines)
