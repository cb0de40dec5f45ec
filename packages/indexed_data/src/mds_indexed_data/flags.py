"""The data flags, declared once (mds_common.flags) for mds-index and mds-train: which datasets
(`--data-path`, `--split`, `--data-cache-path`), the sample order's `--seed`, and the lengths that
set how many samples each split needs (Megatron's `--train-samples` or `--train-iters` with
`--global-batch-size`, `--eval-interval`, `--eval-iters`). Spellings and defaults are
Megatron-DeepSpeed's `arguments.py`; `--seq-length` is mds_common.sample_flags'.

Imports neither numpy nor the readers: `--help` reads these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mds_common.flags import flag


@dataclass(frozen=True, kw_only=True)
class DataFlags:
    data_path: tuple[str, ...] = flag(
        "--data-path",
        multiple=True,
        required=True,
        help="Dataset prefix, or weight/prefix pairs: --data-path 0.3 A 0.7 B.",
    )
    split: str = flag(
        "--split", default="969, 30, 1", help="Train/valid/test document weights, e.g. '949,50,1'."
    )
    data_cache_path: Path | None = flag(
        "--data-cache-path",
        "--cache-dir",
        help="Where the sample-index caches live (default: beside each dataset).",
    )


@dataclass(frozen=True, kw_only=True)
class SeedFlags:
    seed: int = flag(
        "--seed", default=1234, help="Seed of the data order (numpy RandomState, as Megatron's)."
    )


@dataclass(frozen=True, kw_only=True)
class LengthFlags:
    """How long a run is: the sample counts of mds-index build and mds-train."""

    train_iters: int | None = flag("--train-iters", help="Iterations to train.")
    train_samples: int | None = flag("--train-samples", help="Samples to train.")
    global_batch_size: int | None = flag("--global-batch-size", help="Samples per iteration.")
    eval_interval: int = flag("--eval-interval", default=1000, help="Iterations between evals.")
    eval_iters: int = flag("--eval-iters", default=100, help="Batches per evaluation.")
