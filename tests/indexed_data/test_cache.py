"""Index caches: a hit builds nothing, stale or partial caches are never used, builders agree."""

import json
import multiprocessing
import pickle
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import torch
from mds_indexed_data import GPTDataConfig, IndexedDatasetReader, build_train_valid_test_datasets
from mds_indexed_data import build as build_module


@pytest.fixture
def dataset(tmp_path, make_dataset):
    rng = np.random.default_rng(1)
    return make_dataset(tmp_path / "data" / "corpus", rng.integers(1, 300, size=200), seed=1)


def _config(prefix, **overrides) -> GPTDataConfig:
    fields = dict(
        prefixes=(str(prefix),),
        weights=(1.0,),
        seq_length=32,
        num_samples=(900, 40, 0),
        split="90,10,0",
        seed=5,
    )
    fields.update(overrides)
    return GPTDataConfig(**fields)


def _cache_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("corpus_"))


def test_cache_files_next_to_data_and_description(dataset):
    built = build_train_valid_test_datasets(_config(dataset))
    names = _cache_files(dataset.parent)
    assert len(names) == 8  # train and valid: 3 arrays + 1 description each
    assert all(not s.cache_hit for s in built.splits)
    description = json.loads(Path(built.splits[0].cache_file).read_text())
    determining = description["determining_inputs"]
    assert determining["num_samples"] == 900 and determining["seed"] == 5
    assert description["inputs"] == [str(dataset.resolve())]
    assert description["arrays"]["sample_idx"]["dtype"] == "int32"
    assert description["num_samples_available"] == len(built.train)
    assert description["tool"] == "mds-index build" and description["version"] == version(
        "mds-indexed-data"
    )


def test_second_build_is_a_pure_hit(dataset, monkeypatch):
    first = build_train_valid_test_datasets(_config(dataset))
    mtimes = {p: p.stat().st_mtime_ns for p in dataset.parent.iterdir()}

    def no_build(**_):
        raise AssertionError("a cache hit must not build")

    monkeypatch.setattr(build_module, "build_index_mappings", no_build)
    again = build_train_valid_test_datasets(_config(dataset), build_missing=False)
    assert all(s.cache_hit for s in again.splits)
    assert {p: p.stat().st_mtime_ns for p in dataset.parent.iterdir()} == mtimes
    assert again.train[17].tolist() == first.train[17].tolist()


def test_every_determining_input_changes_the_name(dataset):
    base = build_train_valid_test_datasets(_config(dataset)).splits[0].cache_file
    for change in (
        dict(seed=6),
        dict(seq_length=33),
        dict(num_samples=(901, 40, 0)),
        dict(split="91,9,0"),
    ):
        other = build_train_valid_test_datasets(_config(dataset, **change)).splits[0].cache_file
        assert other != base, change


def test_changed_data_is_not_served_from_a_stale_cache(dataset, make_dataset):
    before = build_train_valid_test_datasets(_config(dataset)).splits[0].cache_file
    make_dataset(dataset, np.random.default_rng(2).integers(1, 300, size=200), seed=1)  # rewritten
    after = build_train_valid_test_datasets(_config(dataset))
    assert after.splits[0].cache_file != before and not after.splits[0].cache_hit


@pytest.mark.parametrize(
    "damage", ["no_json", "no_array", "truncated_array", "wrong_json", "bad_json"]
)
def test_partial_or_damaged_cache_is_rebuilt(dataset, damage):
    first = build_train_valid_test_datasets(_config(dataset))
    expected = first.train[3].tolist()
    description_path = Path(first.splits[0].cache_file)
    array_path = description_path.with_name(description_path.stem + "_sample_idx.npy")
    if damage == "no_json":
        description_path.unlink()
    elif damage == "no_array":
        array_path.unlink()
    elif damage == "truncated_array":
        array_path.write_bytes(array_path.read_bytes()[:-16])
    elif damage == "wrong_json":
        description = json.loads(description_path.read_text())
        description["arrays"]["sample_idx"]["shape"][0] += 1
        description_path.write_text(json.dumps(description))
    else:
        description_path.write_text("{")
    with pytest.raises(ValueError, match=r"no complete sample-index cache for .*corpus \(train\)"):
        build_train_valid_test_datasets(_config(dataset), build_missing=False)
    rebuilt = build_train_valid_test_datasets(_config(dataset))
    assert not rebuilt.splits[0].cache_hit and rebuilt.splits[1].cache_hit
    assert rebuilt.train[3].tolist() == expected


def test_cache_dir_flag(dataset, tmp_path):
    built = build_train_valid_test_datasets(_config(dataset, cache_dir=str(tmp_path / "cache")))
    assert Path(built.splits[0].cache_file).parent == tmp_path / "cache"
    assert _cache_files(dataset.parent) == []


def _build_in_child(config):
    build_train_valid_test_datasets(config)


def test_concurrent_builders_leave_one_valid_cache(dataset):
    config = _config(dataset, num_samples=(5000, 40, 0))
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_build_in_child, args=(config,)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert len(_cache_files(dataset.parent)) == 8  # no temporaries left behind
    hit = build_train_valid_test_datasets(config, build_missing=False)
    fresh_dir = str(dataset.parent / "fresh")
    fresh = build_train_valid_test_datasets(
        _config(dataset, num_samples=(5000, 40, 0), cache_dir=fresh_dir)
    )
    for name in ("doc_idx", "sample_idx", "shuffle_idx"):
        np.testing.assert_array_equal(getattr(hit.train, name), getattr(fresh.train, name))


def test_dataset_pickles_small_and_works_in_dataloader_workers(dataset):
    built = build_train_valid_test_datasets(_config(dataset))
    payload = pickle.dumps(built.train)
    assert len(payload) < 4000  # paths, not arrays or tokens
    assert pickle.loads(payload)[11].tolist() == built.train[11].tolist()
    loader = torch.utils.data.DataLoader(built.train, batch_size=8, num_workers=2)
    batches = [batch for _, batch in zip(range(3), loader, strict=False)]
    expected = np.stack([built.train[i] for i in range(24)])
    np.testing.assert_array_equal(torch.cat(batches).numpy(), expected)
    assert batches[0].dtype == torch.int64 and batches[0].shape == (8, 33)


def test_zero_document_split_that_is_needed_is_an_error(dataset):
    message = (
        r"corpus: --split '100,0,0' leaves 0 of its 200 documents for valid, but 40 valid "
        r"samples are requested; change --split or request 0 valid samples"
    )
    with pytest.raises(ValueError, match=message):
        build_train_valid_test_datasets(_config(dataset, split="100,0,0"))
    built = build_train_valid_test_datasets(
        _config(dataset, split="100,0,0", num_samples=(900, 0, 0))
    )
    assert built.valid is None and built.test is None and len(built.train) >= 900


def test_reader_missing_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"missing\.idx: index file not found"):
        build_train_valid_test_datasets(_config(tmp_path / "missing"))


def test_config_validation_names_flags(dataset):
    with pytest.raises(ValueError, match="--seq-length must be >= 1"):
        _config(dataset, seq_length=0)
    with pytest.raises(ValueError, match="--split 'x': 'x' is not a number"):
        _config(dataset, split="x")
    with pytest.raises(ValueError, match="give the prefix without .bin/.idx"):
        _config(f"{dataset}.bin")
    with pytest.raises(ValueError, match=r"--seed must be in \[0, 2\*\*32\)"):
        _config(dataset, seed=-1)
    assert IndexedDatasetReader(dataset).num_documents == 200


def test_unwritable_cache_dir_is_one_clear_error(dataset, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(
        ValueError, match=r"not-a-dir: cannot write the sample-index cache .* --cache-dir"
    ):
        build_train_valid_test_datasets(_config(dataset, cache_dir=str(blocker)))
