"""bf16 ZeRO-1 and ZeRO-2 through mds-train's ShardedMasterAdamW at DP = 2 (gloo, the deepspeed
launcher): the ZeRO-0 run's losses, an exact resume, and DeepSpeed's own optimizer for the stage on
either side of a checkpoint (a run whose DeepSpeed file names the optimizer keeps DeepSpeed's
BF16_Optimizer at ZeRO-1, its DeepSpeedZeroOptimizer at ZeRO-2).

Tolerances: ZeRO-0 (MasterWeightAdamW) and ZeRO-1/2 step the same fp32 masters with the same
AdamW formula and write the same bf16 weights, but ZeRO-0's CPU path multiplies the gradients by
the clipping coefficient and these divide by its reciprocal, and ZeRO-2 averages each micro-batch
(an ulp per gradient, grown by bf16 rounding of the weights): 5e-6 relative was seen at iteration
6, against 1e-3 and more for a partition that is not stepped or not gathered. DeepSpeed's
optimizers accumulate and clip in their own order: 1.5e-5 was seen one to three steps after the
resume, where a lost optimizer state is off by more than 1e-3.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.multiprocess
STAGES = (1, 2)

ITERATIONS, SAVED_AT = 6, 3
ZERO0_RTOL = 5e-5
DEEPSPEED_RTOL = 1e-4
# One process sums a step's four micro-batches where two ranks summed two each: 1.2e-7 seen.
RESHAPED_RTOL = 1e-6
LOST_STATE = 1e-3  # a resume without the optimizer state is off by more than this


def _flags(runs, shared_data, data_cache, out: Path, *extra: str) -> list[str]:
    return runs.bf16_flags(shared_data, data_cache, out, ITERATIONS, *extra)


@pytest.fixture(scope="module")
def deepspeed_file(runs, tmp_path_factory) -> Path:
    return runs.deepspeed_adamw_file(tmp_path_factory.mktemp("ds"))


@pytest.fixture(scope="module", params=STAGES, ids=lambda stage: f"zero{stage}")
def stage(request) -> int:
    return request.param


@pytest.fixture(scope="module")
def zero0_losses(runs, shared_data, data_cache, tmp_path_factory) -> dict[int, float]:
    out = tmp_path_factory.mktemp("zero0")
    runs.train_ok(_flags(runs, shared_data, data_cache, out, "--zero-stage", "0"), nproc=2)
    return runs.losses(out)


@pytest.fixture(scope="module")
def zero_run(runs, stage, shared_data, data_cache, tmp_path_factory) -> Path:
    """DP = 2 at the stage (ours), saved at iterations 3 and 6."""
    out = tmp_path_factory.mktemp(f"zero{stage}")
    save = ["--save", str(out / "ckpt"), "--save-interval", str(SAVED_AT)]
    runs.train_ok(
        _flags(runs, shared_data, data_cache, out, "--zero-stage", str(stage), *save), nproc=2
    )
    return out


@pytest.fixture(scope="module")
def deepspeed_run(runs, stage, shared_data, data_cache, deepspeed_file, tmp_path_factory) -> Path:
    """The same run with DeepSpeed's optimizer, saved at iterations 3 and 6."""
    out = tmp_path_factory.mktemp(f"deepspeed-zero{stage}")
    save = ["--save", str(out / "ckpt"), "--save-interval", str(SAVED_AT)]
    extra = ["--zero-stage", str(stage), *save, "--deepspeed_config", str(deepspeed_file)]
    runs.train_ok(_flags(runs, shared_data, data_cache, out, *extra), nproc=2)
    return out


def _resume(
    runs, stage, shared_data, data_cache, tmp_path, checkpoint, *extra: str, nproc: int = 2
) -> dict:
    out = tmp_path / "resumed"
    flags = ["--zero-stage", str(stage), "--load", str(checkpoint), *extra]
    runs.train_ok(_flags(runs, shared_data, data_cache, out, *flags), nproc=nproc)
    losses = runs.losses(out)
    assert sorted(losses) == list(range(SAVED_AT + 1, ITERATIONS + 1))
    return losses


def test_trains_on_the_zero0_losses(runs, zero_run, zero0_losses):
    ours = runs.losses(zero_run)
    assert sorted(ours) == list(range(1, ITERATIONS + 1))
    for iteration, loss in ours.items():
        assert loss == pytest.approx(zero0_losses[iteration], rel=ZERO0_RTOL), iteration
    assert ours[ITERATIONS] < ours[1]


def test_the_partitions_are_deepspeed_s_bf16_zero_files(zero_run, stage):
    """One file per DP rank under DeepSpeed's name, its optimizer's keys (ZeRO-2's partitions
    without their padding); the mp_rank file keeps DeepSpeed's ZeRO keys (no optimizer, the flat
    groups' shapes, a bf16 config at the stage)."""
    folder = zero_run / "ckpt" / f"global_step{ITERATIONS}"
    names = sorted(p.name for p in folder.glob("*zero_pp_rank*"))
    assert names == [f"bf16_zero_pp_rank_{d}_mp_rank_00_optim_states.pt" for d in (0, 1)]
    mapped = [0, 0]  # each group's parameter elements over both partitions
    for dp, name in enumerate(names):
        saved = torch.load(folder / name, weights_only=False)
        state = saved["optimizer_state_dict"]
        assert state["partition_count"] == [2, 2]
        base = state["base_optimizer_state"]
        assert [group["params"] for group in base["param_groups"]] == [[0], [1]]
        assert all(group["step"] == ITERATIONS for group in base["param_groups"])
        for group, partition in enumerate(state["single_partition_of_fp32_groups"]):
            assert partition.dtype == torch.float32
            padding = state["group_paddings"][group]
            moments = base["state"][group]["exp_avg"]
            assert moments.numel() == partition.numel() + (padding if stage == 2 else 0)
            numel = sum(f.numel for f in state["param_slice_mappings"][group].values())
            assert numel + padding == moments.numel(), (dp, group)
            mapped[group] += numel
        assert state.get("zero_stage") == (None if stage == 1 else 2)
        assert saved["ds_config"]["bf16"] == {"enabled": True}
        assert saved["ds_config"]["zero_optimization"]["stage"] == stage
    model = torch.load(folder / "mp_rank_00_model_states.pt", weights_only=False)
    assert model["optimizer"] is None
    assert [sum(s.numel() for s in group.values()) for group in model["param_shapes"]] == mapped
    assert model["ds_config"]["zero_optimization"]["stage"] == stage


def test_the_saved_groups_are_upstream_s_with_the_next_step_s_learning_rate(runs, zero_run):
    """Upstream's `get_param_groups` keys (its scheduler reads `wd_mult` and `lr_mult` back) and
    the learning rate of the step after the save, which DeepSpeed's load puts into a resuming
    upstream run's groups before its first step."""
    folder = zero_run / "ckpt" / f"global_step{SAVED_AT}"
    logged_lr = {r["iteration"]: r["learning_rate"] for r in runs.train_records(zero_run)}
    for dp in (0, 1):
        saved = torch.load(
            folder / f"bf16_zero_pp_rank_{dp}_mp_rank_00_optim_states.pt", weights_only=False
        )
        groups = saved["optimizer_state_dict"]["base_optimizer_state"]["param_groups"]
        assert [(g["name"], g["wd_mult"], g["lr_mult"]) for g in groups] == [
            ("wd_no_scale_lr", 1.0, 1.0),
            ("no_wd_no_scale_lr", 0.0, 1.0),
        ]
        assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
        # the log line's learning rate is the scheduler's after the step (as upstream's)
        assert all(g["lr"] == pytest.approx(logged_lr[SAVED_AT], rel=1e-6) for g in groups)


def test_resumes_on_the_uninterrupted_losses(
    runs, stage, zero_run, shared_data, data_cache, tmp_path
):
    checkpoint = runs.checkpoint_at(zero_run, SAVED_AT, tmp_path)
    resumed = _resume(runs, stage, shared_data, data_cache, tmp_path, checkpoint)
    whole = runs.losses(zero_run)
    assert resumed == {i: whole[i] for i in resumed}


def test_deepspeed_s_optimizer_resumes_our_partitions(
    runs, stage, zero_run, deepspeed_file, shared_data, data_cache, tmp_path
):
    checkpoint = runs.checkpoint_at(zero_run, SAVED_AT, tmp_path)
    resumed = _resume(
        runs, stage, shared_data, data_cache, tmp_path, checkpoint, "--deepspeed_config",
        str(deepspeed_file),
    )  # fmt: skip
    whole = runs.losses(zero_run)
    for iteration, loss in resumed.items():
        assert loss == pytest.approx(whole[iteration], rel=DEEPSPEED_RTOL), iteration
    if stage == 1:  # the tolerance tells a loaded state from a lost one (once is enough)
        without_state = tmp_path / "without"
        without_state.mkdir()
        fresh = _resume(
            runs, stage, shared_data, data_cache, without_state, checkpoint, "--no-load-optim",
            "--deepspeed_config", str(deepspeed_file),
        )  # fmt: skip
        assert abs(fresh[ITERATIONS] / whole[ITERATIONS] - 1) > LOST_STATE


def test_resumes_deepspeed_s_partitions(
    runs, stage, deepspeed_run, shared_data, data_cache, tmp_path
):
    names = sorted(p.name for p in (deepspeed_run / "ckpt" / "global_step3").glob("*optim*"))
    assert names == [f"bf16_zero_pp_rank_{d}_mp_rank_00_optim_states.pt" for d in (0, 1)]
    checkpoint = runs.checkpoint_at(deepspeed_run, SAVED_AT, tmp_path)
    resumed = _resume(runs, stage, shared_data, data_cache, tmp_path, checkpoint)
    whole = runs.losses(deepspeed_run)
    for iteration, loss in resumed.items():
        assert loss == pytest.approx(whole[iteration], rel=DEEPSPEED_RTOL), iteration


def test_reshaped_partitions_resume_on_one_rank(
    runs, stage, zero_run, shared_data, data_cache, tmp_path
):
    """mds-merge-mp reads the partitions (its optimizer_read), and a one-process run at the stage
    takes the topology-free state into its own partition (reshaped.py). At one rank ZeRO-2 runs
    ZeRO-1's path, so ZeRO-1's partitions are enough."""
    from mds_checkpoint.cli import main

    if stage == 2:
        pytest.skip("one rank's ZeRO-2 is ZeRO-1's path: the zero1 case covers it")

    reshaped = tmp_path / "reshaped"
    checkpoint = runs.checkpoint_at(zero_run, SAVED_AT, tmp_path)
    args = ["merge", "--load", str(checkpoint), "--save", str(reshaped), "--with-optimizer"]
    result = runs.in_process(main, *args, "--target-tensor-model-parallel-size", "1")
    assert result.returncode == 0, result.stderr
    resumed = _resume(runs, stage, shared_data, data_cache, tmp_path, reshaped, nproc=1)
    whole = runs.losses(zero_run)
    for iteration, loss in resumed.items():
        assert loss == pytest.approx(whole[iteration], rel=RESHAPED_RTOL), iteration
