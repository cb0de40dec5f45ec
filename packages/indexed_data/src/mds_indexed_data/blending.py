"""Weighted blend of GPT datasets, as bigscience's `BlendableDataset` + `build_blending_indices`.

Size = sum of the components' lengths (bigscience; Microsoft's fork: sum of requested counts).
Weights are normalised twice exactly as upstream (Python sum in
`get_datasets_weights_and_num_samples`, then `np.sum` in `BlendableDataset`) because the greedy
interleave compares floats and a last-bit difference can flip a tie. The index dtype is uint8 up to
256 datasets (upstream caps at 254), wider beyond.
"""

import math
from collections.abc import Sequence

import numpy as np

from mds_indexed_data import helpers

HEADROOM = 1.005  # upstream's 0.5% extra per component, so the blend never runs a component dry


def normalized_weights(weights: Sequence[float]) -> list[float]:
    """Upstream's first normalisation (sequential Python sum); the weights as printed `input:`."""
    total = 0.0
    for weight in weights:
        total += weight
    if total <= 0:
        raise ValueError("--data-path: the weights sum to 0; give at least one positive weight")
    return [weight / total for weight in weights]


def component_num_samples(weights: Sequence[float], num_samples: Sequence[int]) -> list[list[int]]:
    """Per component, the (train, valid, test) counts ceil(n * w * 1.005) for normalised weights."""
    return [
        [int(math.ceil(count * weight * HEADROOM)) for count in num_samples] for weight in weights
    ]


def blending_index_dtype(num_datasets: int) -> np.dtype:
    if num_datasets <= 256:
        return np.dtype(np.uint8)
    if num_datasets <= 65536:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index, dataset_sample_index) of length `size` for normalised `weights`."""
    array = np.array(weights, dtype=np.float64)
    array /= np.sum(array)  # BlendableDataset's second normalisation, kept for bit-identity
    dataset_index, dataset_sample_index, _ = helpers.build_blending_indices(
        array, size, blending_index_dtype(len(array))
    )
    return dataset_index, dataset_sample_index


class BlendedDataset:
    """Sample i = sample `dataset_sample_index[i]` of component `dataset_index[i]`."""

    def __init__(self, *, name: str, datasets: Sequence, weights: Sequence[float]):
        if len(datasets) != len(weights):
            raise ValueError(f"{len(datasets)} datasets for {len(weights)} weights")
        self.name = name
        self.datasets = list(datasets)
        self.weights = list(weights)
        self.size = sum(len(dataset) for dataset in self.datasets)
        self.dataset_index, self.dataset_sample_index = build_blending_indices(
            self.weights, self.size
        )

    def __len__(self) -> int:
        return self.size

    def achieved_ratios(self, num_samples: int | None = None) -> list[float]:
        """Share of each component in the first `num_samples` samples (default all, as upstream)."""
        count = self.size if num_samples is None else min(num_samples, self.size)
        if count == 0:
            return [0.0] * len(self.datasets)
        counts = np.bincount(self.dataset_index[:count], minlength=len(self.datasets))
        return [float(c) / count for c in counts]

    # Pickling (DataLoader workers under spawn/forkserver) sends the components (file paths) and
    # weights; the blend indices are recomputed, which is faster than piping size * 9 bytes.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["dataset_index"], state["dataset_sample_index"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.dataset_index, self.dataset_sample_index = build_blending_indices(
            self.weights, self.size
        )

    def __getitem__(self, index: int) -> np.ndarray:
        if not -self.size <= index < self.size:
            raise IndexError(f"sample {index} out of range for {self.name} blend of {self.size}")
        component = int(self.dataset_index[index])
        sample = int(self.dataset_sample_index[index])
        dataset = self.datasets[component]
        if sample >= len(dataset):
            # Upstream indexes past the component here too; only a consumer reading far beyond the
            # requested sample count (the blend is longer than that) can reach it.
            raise IndexError(
                f"blend sample {index} needs sample {sample} of component {component} "
                f"({dataset.name}, {len(dataset)} samples); request more samples when building"
            )
        return dataset[sample]
