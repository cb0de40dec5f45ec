"""Damaged files of a ZeRO-1 checkpoint, as a load meets them:

- `--no-load-optim` (and `--finetune`) read no ZeRO-1/2 partition file, so a damaged one does not
  stop them (it used to: "copy it again", though the weights were all the run needed); a load that
  reads the optimizer state still refuses it in one line naming the file.
- A universal checkpoint resumed at ZeRO-1 goes through DeepSpeed's own loader, which said
  `exp_avg not found in optimizer state fragment` for a missing `exp_avg.pt` and gave a 70-line
  traceback for an `fp32.pt` cut short; both are now one line naming the file, as at ZeRO-0.
- A partition file of another ZeRO stage (stage 3's against stage 1/2's) is refused in one line
  naming it before the optimizer reads it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

ERROR = "mds-train: error: "
PARTITION = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
WORDS = "language_model.embedding.word_embeddings.weight"
ZERO1 = ("--zero-stage", "1")


def _train(runs, shared_data, data_cache, out: Path, *extra) -> object:
    return runs.train(runs.checkpoint_test_flags(shared_data, data_cache, out, *ZERO1, *extra))


@pytest.fixture(scope="module")
def zero1_save(runs, shared_data, data_cache, tmp_path_factory) -> Path:
    """Two ZeRO-1 iterations in one process, saved at 2: the save folder."""
    out = tmp_path_factory.mktemp("zero1")
    save = ["--save", out / "checkpoints", "--save-interval", 2, "--train-iters", 2]
    result = _train(runs, shared_data, data_cache, out, *save)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "checkpoints" / "global_step2" / PARTITION).is_file()
    return out / "checkpoints"


def _last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_a_damaged_partition_stops_only_a_load_that_reads_it(
    runs, shared_data, data_cache, zero1_save, tmp_path
):
    save = tmp_path / "checkpoints"
    shutil.copytree(zero1_save, save)
    partition = save / "global_step2" / PARTITION
    partition.write_bytes(partition.read_bytes()[:-1000])
    resume = ["--load", save, "--train-iters", 3]
    result = _train(runs, shared_data, data_cache, tmp_path / "a", *resume, "--no-load-optim")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {save / 'global_step2'} at iteration 2" in result.stderr
    result = _train(runs, shared_data, data_cache, tmp_path / "b", *resume)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert _last_line(result).startswith(f"{ERROR}{partition}: not a readable torch checkpoint")
    assert _last_line(result).endswith("the checkpoint is damaged or incomplete: copy it again")


@pytest.fixture(scope="module")
def universal(runs, zero1_save, tmp_path_factory) -> Path:
    return runs.universal_of(zero1_save, tmp_path_factory.mktemp("zero1-universal") / "universal")


@pytest.mark.parametrize("damage", ["missing exp_avg", "fp32 cut short"])
def test_a_damaged_universal_file_at_zero1_is_one_line_naming_it(
    runs, shared_data, data_cache, universal, tmp_path, damage
):
    copy = tmp_path / "universal"
    shutil.copytree(universal, copy)
    folder = copy / "global_step2" / "zero" / WORDS
    if damage == "missing exp_avg":
        (folder / "exp_avg.pt").unlink()
        expected = (
            f"{ERROR}{folder / 'exp_avg.pt'}: missing, the exp_avg of {WORDS}; the universal "
            "checkpoint is incomplete: copy it again, or write it again with mds-merge-mp "
            "--with-optimizer"
        )
    else:
        fp32 = folder / "fp32.pt"
        fp32.write_bytes(fp32.read_bytes()[:-1000])
        expected = (
            f"{ERROR}{fp32}: not a readable torch checkpoint file (a zip archive without its "
            f"directory: the file is cut short at {fp32.stat().st_size:,} bytes); the universal "
            "checkpoint is damaged or incomplete: copy it again"
        )
    load = ["--universal-checkpoint", "--load", copy, "--train-iters", 3]
    result = _train(runs, shared_data, data_cache, tmp_path / "out", *load)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert _last_line(result) == expected


@pytest.mark.parametrize(
    ("saved_keys", "run_stage", "message"),
    [
        ({"fp32_flat_groups": []}, 1, "ZeRO-3 optimizer state, this run is at ZeRO-1"),
        (
            {"single_partition_of_fp32_groups": []},
            3,
            "ZeRO-1/2 optimizer state, this run is at ZeRO-3",
        ),
    ],
    ids=["zero3-file-at-zero1", "zero1-file-at-zero3"],
)
def test_a_partition_of_another_stage_is_refused_naming_the_file(
    tmp_path, saved_keys, run_stage, message
):
    """A ZeRO-3 partition file (DeepSpeed's `fp32_flat_groups`) met by a ZeRO-1/2 run, or the
    other way round: one line naming the file and the way on, before the optimizer sees it."""
    import torch
    from mds_checkpoint import zero_optimizer_file
    from mds_train.checkpointing import load_optimizer_partition

    path = tmp_path / zero_optimizer_file(0, 0, bf16=True)
    torch.save({"optimizer_state_dict": saved_keys}, path)

    def never(*args, **kwargs):
        raise AssertionError("the optimizer was given the other stage's state")

    context = SimpleNamespace(
        groups=SimpleNamespace(dp_rank=0, tp_rank=0),
        optimizer=SimpleNamespace(stage=run_stage, load_state_dict=never),
    )
    with pytest.raises(ValueError) as error:
        load_optimizer_partition(context, tmp_path)
    assert str(error.value) == (
        f"{path}: {message}; reshape it with mds-merge-mp --with-optimizer, or add --no-load-optim"
    )
