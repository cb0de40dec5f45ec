"""The frozen configuration of GPT sample indexing, shared by `mds-index build` and `mds-train`.

Field meanings follow Megatron-DeepSpeed's flags (`--data-path`, `--split`, `--seq-length`,
`--seed`, `--train-samples` or the iteration-derived counts of
`build_train_valid_test_data_iterators`).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mds_indexed_data.split import parse_split

# bigscience's `cutoff_last_epoch`; Microsoft's fork and NVIDIA use 0.80 (see README).
SEPARATE_LAST_EPOCH_CUTOFF = 0.95


def parse_data_path(items: Sequence[str]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """Megatron's `--data-path`: one prefix, or alternating `weight prefix` pairs.

    Weights are returned as given (not normalised): normalisation happens where upstream does it.
    """
    items = [item for item in items if item.strip()]
    if not items:
        raise ValueError(
            "--data-path: give a dataset prefix, or weight/prefix pairs such as '0.3 A 0.7 B'"
        )
    if len(items) == 1:
        return (1.0,), (items[0].strip(),)
    if len(items) % 2:
        raise ValueError(
            f"--data-path: {len(items)} values given; with several datasets give weight/prefix "
            "pairs such as '0.3 A 0.7 B'"
        )
    weights, prefixes = [], []
    for position in range(0, len(items), 2):
        text = items[position]
        try:
            weight = float(text)
        except ValueError:
            raise ValueError(
                f"--data-path: weight {text!r} (value {position + 1}) is not a number; give "
                "weight/prefix pairs such as '0.3 A 0.7 B'"
            ) from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"--data-path: weight {text!r} must be finite and >= 0")
        weights.append(weight)
        prefixes.append(items[position + 1].strip())
    if sum(weights) <= 0:
        raise ValueError("--data-path: the weights sum to 0; give at least one positive weight")
    return tuple(weights), tuple(prefixes)


def samples_from_iterations(
    *, train_iters: int, global_batch_size: int, eval_interval: int, eval_iters: int
) -> tuple[int, int, int]:
    """(train, valid, test) sample counts as Megatron derives them from iteration flags."""
    for flag, value in (
        ("--train-iters", train_iters),
        ("--global-batch-size", global_batch_size),
        ("--eval-interval", eval_interval),
    ):
        if value <= 0:
            raise ValueError(f"{flag} must be > 0, got {value}")
    if eval_iters < 0:
        raise ValueError(f"--eval-iters must be >= 0, got {eval_iters}")
    train = train_iters * global_batch_size
    valid = (train_iters // eval_interval + 1) * eval_iters * global_batch_size
    test = eval_iters * global_batch_size
    return train, valid, test


@dataclass(frozen=True)
class GPTDataConfig:
    """Everything that determines the train/valid/test sample streams.

    `weights[i]` goes with `prefixes[i]` (one dataset: weights == (1.0,)); `num_samples` is the
    requested (train, valid, test) count; `cache_dir` None means next to each dataset's files.
    `blend` None means "blend when there are several prefixes"; Megatron also blends a single
    `weight prefix` pair (with the 0.5% head-room), which `from_data_path` reproduces.
    """

    prefixes: tuple[str, ...]
    weights: tuple[float, ...]
    seq_length: int
    num_samples: tuple[int, int, int]
    split: str = "969, 30, 1"
    seed: int = 1234
    cache_dir: str | None = None
    blend: bool | None = None

    def __post_init__(self) -> None:
        if self.blend is None:
            object.__setattr__(self, "blend", len(self.prefixes) > 1)
        object.__setattr__(self, "prefixes", tuple(str(prefix) for prefix in self.prefixes))
        object.__setattr__(self, "weights", tuple(float(weight) for weight in self.weights))
        object.__setattr__(self, "num_samples", tuple(int(count) for count in self.num_samples))
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", str(self.cache_dir))
        if not self.prefixes:
            raise ValueError("--data-path: give at least one dataset prefix")
        if not self.blend and len(self.prefixes) > 1:
            raise ValueError("--data-path: several datasets are always blended; give their weights")
        if len(self.weights) != len(self.prefixes):
            raise ValueError(
                f"--data-path: {len(self.weights)} weights for {len(self.prefixes)} datasets"
            )
        if any(not math.isfinite(w) or w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError("--data-path: weights must be finite, >= 0, and sum to more than 0")
        for prefix in self.prefixes:
            if prefix.endswith((".bin", ".idx")):
                raise ValueError(f"--data-path: {prefix!r}: give the prefix without .bin/.idx")
        if self.seq_length < 1:
            raise ValueError(f"--seq-length must be >= 1, got {self.seq_length}")
        if len(self.num_samples) != 3 or any(count < 0 for count in self.num_samples):
            raise ValueError(
                "--train-samples/--valid-samples/--test-samples must be >= 0, "
                f"got {self.num_samples}"
            )
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"--seed must be in [0, 2**32), got {self.seed}")
        parse_split(self.split)  # raises a ValueError naming --split

    @classmethod
    def from_data_path(cls, data_path: Sequence[str], **fields) -> "GPTDataConfig":
        """Builds the config from Megatron-style `--data-path` values (see `parse_data_path`)."""
        weights, prefixes = parse_data_path(data_path)
        blend = sum(1 for item in data_path if item.strip()) > 1
        return cls(prefixes=prefixes, weights=weights, blend=blend, **fields)

    def cache_dir_for(self, prefix: str) -> Path:
        return Path(self.cache_dir) if self.cache_dir else Path(prefix).resolve().parent
