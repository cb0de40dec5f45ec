"""What --load means (checkpointing.find_checkpoint), on folders laid out by hand: a save folder's
`latest` checkpoint or one global_stepN folder, as mds-merge-mp and mds-generate read a path; a
--load that is also --save and holds no checkpoint yet starts from scratch (a requeue script's
first run); any other --load that holds no checkpoint is an error naming it."""

import json
from pathlib import Path

import pytest
from mds_train.checkpointing import find_checkpoint


def checkpoint(save: Path, iteration: int, *, latest: bool = True) -> Path:
    """A checkpoint folder as locate and find_checkpoint see it: DeepSpeed's file and meta.json."""
    folder = save / f"global_step{iteration}"
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"")
    meta = {"format": "mds-train checkpoint", "iteration": iteration}
    (folder / "meta.json").write_text(json.dumps(meta))
    if latest:
        (save / "latest").write_text(folder.name)
    return folder


def test_a_save_folder_loads_its_latest_and_a_tag_folder_loads_itself(tmp_path):
    save = tmp_path / "ckpt"
    older = checkpoint(save, 3)
    newer = checkpoint(save, 6)
    assert find_checkpoint(save) == (newer, json.loads((newer / "meta.json").read_text()))
    for save_dir in (None, tmp_path / "elsewhere", older):
        path, meta = find_checkpoint(older, save_dir=save_dir)
        assert path == older and meta["iteration"] == 3


@pytest.mark.parametrize(
    "leftovers", [[], ["metrics.jsonl", "config.json"], ["global_step4.partial"]]
)
def test_a_requeue_first_run_starts_from_scratch(tmp_path, leftovers):
    """--save X --load X with X absent, empty, or holding what a run killed before its first
    save leaves (its metrics, config, an unfinished save)."""
    assert find_checkpoint(tmp_path / "absent", save_dir=tmp_path / "absent") is None
    save = tmp_path / "ckpt"
    save.mkdir()
    for name in leftovers:
        (save / name).mkdir() if name.endswith(".partial") else (save / name).write_text("{}\n")
    assert find_checkpoint(save, save_dir=save) is None


@pytest.mark.parametrize("contents", [[], ["metrics.jsonl"], ["notes.txt", "run1"]])
@pytest.mark.parametrize("save_elsewhere", [True, False])
def test_a_load_folder_without_a_checkpoint_is_an_error(tmp_path, contents, save_elsewhere):
    load = tmp_path / "not-a-checkpoint"
    load.mkdir()
    for name in contents:
        (load / name).write_text("x")
    with pytest.raises(ValueError) as error:
        find_checkpoint(load, save_dir=tmp_path / "ckpt" if save_elsewhere else None)
    message = str(error.value)
    assert message.startswith(f"{load}: not a checkpoint") and "global_stepN" in message
    assert "\n" not in message
