"""What --load means (checkpointing.find_checkpoint), on folders laid out by hand: a save folder's
`latest` checkpoint or one global_stepN folder, as mds-merge-mp and mds-generate read a path; a
--load that is also --save and holds no checkpoint yet starts from scratch (a requeue script's
first run); any other --load that holds no checkpoint is an error naming it. A checkpoint of
another TP gets the line that says how to reshape it (check_compatible)."""

import json
from pathlib import Path

import pytest
from mds_checkpoint.meta import CheckpointMeta, Parallel, Progress
from mds_train.checkpointing import check_compatible, find_checkpoint


def checkpoint(save: Path, iteration: int, *, latest: bool = True) -> Path:
    """A checkpoint folder as locate and find_checkpoint see it: DeepSpeed's file and meta.json."""
    folder = save / f"global_step{iteration}"
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(b"")
    meta = CheckpointMeta(model={}, parallel=Parallel(), progress=Progress(iteration=iteration))
    (folder / "meta.json").write_text(json.dumps(meta.to_json()))
    if latest:
        (save / "latest").write_text(folder.name)
    return folder


def test_a_save_folder_loads_its_latest_and_a_tag_folder_loads_itself(tmp_path):
    save = tmp_path / "ckpt"
    older = checkpoint(save, 3)
    newer = checkpoint(save, 6)
    path, meta = find_checkpoint(save)
    assert path == newer and meta.iteration == 6
    for save_dir in (None, tmp_path / "elsewhere", older):
        path, meta = find_checkpoint(older, save_dir=save_dir)
        assert path == older and meta.iteration == 3


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


def test_a_requeue_with_only_upstream_s_iteration_file_loads_its_checkpoint(tmp_path):
    """--save X --load X where X holds a checkpoint and Megatron-DeepSpeed's
    latest_checkpointed_iteration.txt but no `latest`: the checkpoint it names is loaded (it used
    to start from scratch beside it)."""
    save = tmp_path / "ckpt"
    folder = checkpoint(save, 3, latest=False)
    (save / "latest_checkpointed_iteration.txt").write_text("3")
    path, meta = find_checkpoint(save, save_dir=save)
    assert path == folder and meta.iteration == 3


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


def test_a_checkpoint_of_another_tp_is_named_as_such(tmp_path):
    """GPT-2's 50257 tokens pad to 50304 at TP=1 and 50688 at TP=4 (Megatron's
    _vocab_size_with_padding: a multiple of 128 x TP), so the padded vocabulary differs too; the
    line must name the TP change and how to reshape it, not blame the vocabulary."""
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_size": 256}
    saved = CheckpointMeta(
        model={**model, "padded_vocab_size": 50688},
        parallel=Parallel(tensor_model_parallel_size=4, data_parallel_size=1, world_size=4),
    )
    run = CheckpointMeta(
        model={**model, "padded_vocab_size": 50304},
        parallel=Parallel(tensor_model_parallel_size=1, data_parallel_size=1, world_size=1),
    )
    with pytest.raises(ValueError) as error:
        check_compatible(saved, run, path=tmp_path, loads_optimizer=True)
    assert str(error.value) == (
        f"{tmp_path}: saved with TP=4, PP=1 but this run has TP=1, PP=1; reshape it with "
        "mds-merge-mp merge --target-tensor-model-parallel-size 1 "
        "--target-pipeline-model-parallel-size 1 --with-optimizer, or change "
        "--tensor-model-parallel-size"
    )
    # At the same TP a padded vocabulary of another size is a model flag to match.
    same_tp = saved.replace(parallel=run.parallel)
    with pytest.raises(ValueError, match="padded_vocab_size is 50688 in the checkpoint but 50304"):
        check_compatible(same_tp, run, path=tmp_path, loads_optimizer=True)


def test_another_vocabulary_padding_names_the_flags_that_give_it(tmp_path):
    """A checkpoint padded with --make-vocab-size-divisible-by 256 (50432 rows for GPT-2's 50257
    tokens) against a run at the default 128 (50304): the line names the flag and the
    checkpoint's value; it used to say only "train with the checkpoint's model flags"."""
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_size": 256}
    parallel = Parallel(tensor_model_parallel_size=1, data_parallel_size=1, world_size=1)
    saved = CheckpointMeta(
        model={**model, "padded_vocab_size": 50432, "make_vocab_size_divisible_by": 256},
        parallel=parallel,
    )
    run = CheckpointMeta(
        model={**model, "padded_vocab_size": 50304, "make_vocab_size_divisible_by": 128},
        parallel=parallel,
    )
    with pytest.raises(ValueError) as error:
        check_compatible(saved, run, path=tmp_path, loads_optimizer=True)
    assert str(error.value) == (
        f"{tmp_path}: padded_vocab_size is 50432 in the checkpoint but 50304 in this run; give "
        "--make-vocab-size-divisible-by 256 (the checkpoint's) or --pad-vocab-size-to 50432"
    )
    padded = saved.replace(model={**saved.model, "pad_vocab_size_to": 50432})
    with pytest.raises(ValueError, match="; add --pad-vocab-size-to 50432 .the checkpoint's.$"):
        check_compatible(padded, run, path=tmp_path, loads_optimizer=True)


@pytest.mark.parametrize("save_dir", [None, "same"])
def test_an_empty_or_dangling_latest_names_itself(tmp_path, save_dir):
    save = tmp_path / "ckpt"
    checkpoint(save, 3)
    checkpoint(save, 12, latest=False)
    checkpoint(save, 6, latest=False)
    repair = "write the name of a checkpoint folder into it (the newest is global_step12), or give"
    for text, what in (("", "is empty"), ("global_step9\n", "names 'global_step9', which is not")):
        (save / "latest").write_text(text)
        with pytest.raises(ValueError) as error:
            find_checkpoint(save, save_dir=save if save_dir else None)
        assert str(error.value).startswith(f"{save / 'latest'}: {what}"), str(error.value)
        assert repair in str(error.value)


@pytest.mark.parametrize("exit_on_missing", [False, True])
def test_exit_on_missing_checkpoint_turns_a_first_run_into_an_error(tmp_path, exit_on_missing):
    """Megatron's --exit-on-missing-checkpoint: a --load that holds no checkpoint (here the
    requeue's --save X --load X, which otherwise starts from scratch) ends the run instead."""
    from mds_train.cli import build_config
    from mds_train.config import Topology
    from mds_train.run import _checkpoint_to_load

    from .test_config import DATA, parse

    argv = [
        *DATA,
        *"--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8".split(),
        *"--micro-batch-size 1 --lr 1e-3 --train-iters 1".split(),
        *("--save", str(tmp_path / "ckpt"), "--load", str(tmp_path / "ckpt")),
    ]
    if exit_on_missing:
        argv.append("--exit-on-missing-checkpoint")
    config = build_config(parse(argv))
    topology = Topology(world_size=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    if not exit_on_missing:
        assert _checkpoint_to_load(config, topology, rank=0) is None
        return
    with pytest.raises(ValueError, match="--load holds no checkpoint and --exit-on-missing"):
        _checkpoint_to_load(config, topology, rank=0)
