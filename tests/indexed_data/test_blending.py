"""Blends of 2 and 300 datasets equal the twin's per-component indices and greedy interleave."""

import pickle

import numpy as np
import pytest
from mds_indexed_data import (
    BlendedDataset,
    GPTDataConfig,
    IndexedDatasetReader,
    IndexedDatasetWriter,
    build_train_valid_test_datasets,
)
from mds_indexed_data.blending import build_blending_indices, component_num_samples
from mds_indexed_data.config import parse_data_path


def test_reference_first_twenty_picks():
    dataset_index, sample_index = build_blending_indices([0.35, 0.65], 20)
    picks = [f"{'AB'[d]}{s}" for d, s in zip(dataset_index, sample_index, strict=True)]
    assert picks == "B0 A0 B1 A1 B2 B3 A2 B4 B5 A3 B6 B7 A4 B8 B9 A5 B10 B11 A6 B12".split()
    assert dataset_index.dtype == np.uint8 and sample_index.dtype == np.int64


def _check_blend_against_twin(twin, built, config, readers, split_index, num_samples):
    """Rebuilds the blend of one split with the twin and compares indices and some samples."""
    weights = twin.blend_weights(list(config.weights))
    counts = twin.component_counts(weights, list(config.num_samples))
    blend = getattr(built, ("train", "valid", "test")[split_index])
    assert isinstance(blend, BlendedDataset)
    components = []
    for reader, component_counts in zip(readers, counts, strict=True):
        sizes = [int(s) for s in reader.sizes]
        start, end = twin.split_ranges(config.split, len(sizes))[split_index]
        components.append(
            twin.index_mappings(
                sizes, start, end, component_counts[split_index], config.seq_length, config.seed
            )
        )
    lengths = [len(rows) - 1 for _, rows, _, _, _ in components]
    assert [len(d) for d in blend.datasets] == lengths
    dataset_index, sample_index = twin.blending_indices(weights, sum(lengths))
    assert blend.dataset_index.tolist() == dataset_index
    assert blend.dataset_sample_index.tolist() == sample_index
    for i in sorted({0, 1, 2, len(blend) // 3, num_samples - 1}):
        d, s = dataset_index[i], sample_index[i]
        doc_idx, rows, shuffle_idx, _, _ = components[d]
        expected = twin.sample_tokens(readers[d].get, doc_idx, rows, shuffle_idx, s)
        assert blend[i].tolist() == expected
    return blend


def test_two_component_blend_matches_twin(twin, golden_prefix, tmp_path):
    golden = IndexedDatasetReader(golden_prefix)
    prefixes = []
    for name, (start, end) in (("a", (0, 400)), ("b", (400, 1000))):
        with IndexedDatasetWriter(tmp_path / name, dtype=np.uint16) as writer:
            for i in range(start, end):
                writer.add_document(golden[i])
        prefixes.append(str(tmp_path / name))
    config = GPTDataConfig.from_data_path(
        ["0.35", prefixes[0], "0.65", prefixes[1]],
        seq_length=512,
        num_samples=(3000, 120, 40),
        split="90,7,3",
        seed=1234,
    )
    built = build_train_valid_test_datasets(config)
    readers = [IndexedDatasetReader(p) for p in prefixes]
    for split_index, n in enumerate(config.num_samples):
        blend = _check_blend_against_twin(twin, built, config, readers, split_index, n)
        assert blend.dataset_index.dtype == np.uint8
    payload = pickle.dumps(built.train)
    assert len(payload) < 5000  # components as paths, blend indices recomputed
    clone = pickle.loads(payload)
    np.testing.assert_array_equal(clone.dataset_index, built.train.dataset_index)
    assert clone[len(clone) // 2].tolist() == built.train[len(clone) // 2].tolist()
    assert component_num_samples([0.35, 0.65], [3000, 120, 40]) == [[1056, 43, 15], [1960, 79, 27]]
    train = [b for b in built.blends if b.split_name == "train"][0]
    assert train.input_weights == pytest.approx([0.35, 0.65])
    assert train.achieved_ratios == pytest.approx([0.35, 0.65], abs=0.01)
    # Caches went next to each dataset: 3 splits x (3 arrays + description) per component.
    assert len(list(tmp_path.glob("a_*"))) == 12 and len(list(tmp_path.glob("b_*"))) == 12


def test_three_hundred_component_blend_matches_twin(twin, tmp_path, make_dataset):
    rng = np.random.default_rng(3)
    data_path = []
    for k in range(300):
        prefix = make_dataset(tmp_path / f"c{k:03d}", rng.integers(1, 60, size=6), seed=k)
        # A few equal weights: ties must resolve to the lowest index, as upstream.
        weight = 1.0 if k % 50 == 0 else float(rng.integers(1, 9)) / 7
        data_path += [repr(weight), str(prefix)]
    config = GPTDataConfig.from_data_path(
        data_path,
        seq_length=16,
        num_samples=(3000, 0, 0),
        split="1",
        seed=11,
        cache_dir=str(tmp_path / "cache"),
    )
    built = build_train_valid_test_datasets(config)
    assert built.valid is None and built.test is None
    readers = [IndexedDatasetReader(p) for p in config.prefixes]
    blend = _check_blend_against_twin(twin, built, config, readers, 0, 3000)
    assert blend.dataset_index.dtype == np.uint16
    assert int(blend.dataset_index.max()) >= 255  # indices past uint8 are really used


@pytest.mark.parametrize(
    "values, message",
    [
        (["0.3", "a", "0.7"], "--data-path: 3 values given"),
        (["heavy", "a", "0.7", "b"], "--data-path: weight 'heavy' .* is not a number"),
        (["0", "a", "0", "b"], "--data-path: the weights sum to 0"),
        (["-1", "a", "2", "b"], "--data-path: weight '-1' must be finite and >= 0"),
        ([], "--data-path: give a dataset prefix"),
    ],
)
def test_bad_data_path(values, message):
    with pytest.raises(ValueError, match=message):
        parse_data_path(values)


def test_single_prefix_data_path():
    assert parse_data_path([" data/x_text_document "]) == ((1.0,), ("data/x_text_document",))


def test_single_weighted_pair_is_a_blend_of_one_as_upstream(twin, golden_prefix, tmp_path):
    config = GPTDataConfig.from_data_path(
        ["1.0", str(golden_prefix)],
        seq_length=256,
        num_samples=(1000, 10, 0),
        split="949,50,1",
        cache_dir=str(tmp_path),
    )
    assert config.blend and len(config.prefixes) == 1
    built = build_train_valid_test_datasets(config)
    assert isinstance(built.train, BlendedDataset)
    reader = IndexedDatasetReader(golden_prefix)
    _check_blend_against_twin(twin, built, config, [reader], 0, 1000)
    # n = ceil(1000 * 1.0 * 1.005): the head-room applies to a single weighted dataset too.
    assert built.train.datasets[0].num_samples_requested == 1005
    plain = GPTDataConfig.from_data_path(
        [str(golden_prefix)], seq_length=256, num_samples=(1, 0, 0)
    )
    assert not plain.blend
