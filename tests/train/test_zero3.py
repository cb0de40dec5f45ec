"""bf16 ZeRO-3 through mds-train's own optimizers (fully_sharded.py): FSDP2 at DP = 2 (gloo, the
deepspeed launcher), the ZeRO-0 step at DP = 1; the ZeRO-0 run's losses, an exact resume, and
DeepSpeed's own stage 3 (kept by a DeepSpeed file that names the optimizer) on either side of a
checkpoint (ours in upstream's one parameter group, reshaped by mds-merge-mp for its two), its
files compared key for key with ours.

Tolerances: at DP = 1 the step is ZeRO-0's (equal losses seen); at DP = 2 FSDP2 reduces the fp32
gradients with a reduce-scatter where ZeRO-0 all-reduces them, and torch's AdamW steps the fp32
shards where ZeRO-0's runs over whole masters: 4.7e-6 relative was seen at iteration 6.
DeepSpeed's stage 3 accumulates and clips in its own order: 1.4e-5 was seen one to three steps
after a resume, where a lost optimizer state is off by more than 1e-3.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.multiprocess
RANKS = (1, 2)

ITERATIONS, SAVED_AT = 6, 3
ZERO0_RTOL = 5e-5
DEEPSPEED_RTOL = 1e-4
RESHAPED_RTOL = 1e-6  # one process sums the four micro-batches two ranks summed two each
LOST_STATE = 1e-3
# The model file's keys that differ between runs (progress records, the RNG, configs).
RUN_RECORDS = {"args", "rng_state", "ds_config", "mds_train", "lr_scheduler", "ds_version"}
UPSTREAM_STYLE_FILE = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
                      "gradient_clipping": 1.0}  # fmt: skip
# What follows the parameter groups, by the end of its path: ours hold upstream's one,
# DeepSpeed's as mds-train builds it two (compared by _upstream_s_one_group).
GROUPED = (".param_shapes", ".optimizer_state_dict.fp32_flat_groups",
           ".optimizer_state_dict.optimizer_state_dict")  # fmt: skip


def _flags(runs, shared_data, data_cache, out: Path, *extra: str) -> list[str]:
    return runs.bf16_flags(shared_data, data_cache, out, ITERATIONS, *extra)


@pytest.fixture(scope="module")
def deepspeed_file(runs, tmp_path_factory) -> Path:
    return runs.deepspeed_adamw_file(tmp_path_factory.mktemp("ds"))


@pytest.fixture(scope="module", params=RANKS, ids=lambda n: f"dp{n}")
def ranks(request) -> int:
    return request.param


@pytest.fixture(scope="module")
def zero0_losses(runs, ranks, shared_data, data_cache, tmp_path_factory) -> dict[int, float]:
    out = tmp_path_factory.mktemp(f"zero0-dp{ranks}")
    runs.train_ok(_flags(runs, shared_data, data_cache, out, "--zero-stage", "0"), nproc=ranks)
    return runs.losses(out)


def _saving_run(runs, ranks, shared_data, data_cache, out: Path, *extra: str) -> Path:
    save = ["--save", str(out / "ckpt"), "--save-interval", str(SAVED_AT)]
    flags = _flags(runs, shared_data, data_cache, out, "--zero-stage", "3", *save, *extra)
    runs.train_ok(flags, nproc=ranks)
    return out


@pytest.fixture(scope="module")
def zero3_run(runs, ranks, shared_data, data_cache, tmp_path_factory) -> Path:
    """Ours, saved at iterations 3 and 6, with a DeepSpeed file as upstream's scripts write one
    (its bf16 section enabled: DeepSpeed must stay in its fp32 mode under our optimizer)."""
    out = tmp_path_factory.mktemp(f"zero3-dp{ranks}")
    upstream_file = out / "ds_config.json"
    upstream_file.write_text(json.dumps(UPSTREAM_STYLE_FILE))
    return _saving_run(runs, ranks, shared_data, data_cache, out,
                       "--deepspeed_config", str(upstream_file))  # fmt: skip


@pytest.fixture(scope="module")
def deepspeed_run(runs, ranks, shared_data, data_cache, deepspeed_file, tmp_path_factory) -> Path:
    """DeepSpeed's own stage 3, saved at iterations 3 and 6."""
    out = tmp_path_factory.mktemp(f"deepspeed-zero3-dp{ranks}")
    extra = ("--deepspeed_config", str(deepspeed_file))
    return _saving_run(runs, ranks, shared_data, data_cache, out, *extra)


def _resume(runs, ranks, shared_data, data_cache, tmp_path, checkpoint, *extra: str) -> dict:
    out = tmp_path / "resumed"
    flags = ["--zero-stage", "3", "--load", str(checkpoint), *extra]
    runs.train_ok(_flags(runs, shared_data, data_cache, out, *flags), nproc=ranks)
    losses = runs.losses(out)
    assert sorted(losses) == list(range(SAVED_AT + 1, ITERATIONS + 1))
    return losses


def test_trains_on_the_zero0_losses(runs, zero3_run, zero0_losses):
    ours = runs.losses(zero3_run)
    assert sorted(ours) == list(range(1, ITERATIONS + 1))
    for iteration, loss in ours.items():
        assert loss == pytest.approx(zero0_losses[iteration], rel=ZERO0_RTOL), iteration
    assert ours[ITERATIONS] < ours[1]


def _same_structure(ours, theirs, where: str, *, grouped: tuple[str, ...] = ()) -> None:
    """Keys in the same order, tensors of the same shape and dtype, other values equal (but
    under the paths ending in one of `grouped`)."""
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs), where
        for key in theirs:
            path = f"{where}.{key}"
            if key not in RUN_RECORDS and not path.endswith(grouped):
                _same_structure(ours[key], theirs[key], path, grouped=grouped)
    elif isinstance(theirs, list | tuple):
        assert len(ours) == len(theirs), where
        for i, (mine, its) in enumerate(zip(ours, theirs, strict=True)):
            _same_structure(mine, its, f"{where}[{i}]")
    elif torch.is_tensor(theirs):
        assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype), where
    elif type(theirs).__module__.startswith("deepspeed"):  # its loss scaler
        assert type(ours) is type(theirs) and vars(ours) == vars(theirs), where
    elif where.endswith(".fused"):  # how each run stepped, not what it saved
        return
    else:
        assert ours == theirs, where


def test_the_files_are_deepspeed_s_stage_3_files(ranks, zero3_run, deepspeed_run):
    """The same file names as DeepSpeed's stage 3 writes, each with its keys in its order and
    tensors of its shapes: the model file per DP rank (placeholders, the sub-groups' shapes) and
    the optimizer partition (its loss scaler, the inner AdamW's state over the fp32 sub-group
    partitions)."""
    ours = zero3_run / "ckpt" / f"global_step{SAVED_AT}"
    theirs = deepspeed_run / "ckpt" / f"global_step{SAVED_AT}"
    names = sorted(p.name for p in theirs.glob("*zero_pp_rank*"))
    assert len(names) == 2 * ranks
    assert sorted(p.name for p in ours.glob("*zero_pp_rank*")) == names
    assert not list(ours.glob("mp_rank_*"))
    for name in names:
        mine = torch.load(ours / name, weights_only=False)
        its = torch.load(theirs / name, weights_only=False)
        _same_structure(mine, its, name, grouped=GROUPED)
        if "optim_states" in name:
            assert mine["ds_config"]["zero_optimization"]["stage"] == 3
            assert mine["ds_config"]["bf16"] == {"enabled": True}
            _upstream_s_one_group(mine["optimizer_state_dict"], its["optimizer_state_dict"])
        else:
            (shapes,) = mine["param_shapes"]  # one sub-group: the parameters of both of theirs
            assert shapes == {k: v for group in its["param_shapes"] for k, v in group.items()}


def _upstream_s_one_group(mine: dict, its: dict) -> None:
    """Ours: upstream's one group over the values of DeepSpeed's (here two, mds-train's)."""
    from mds_train.param_groups import UPSTREAM_ZERO3_GROUP

    (flat,) = mine["fp32_flat_groups"]
    assert flat.numel() == sum(f.numel() for f in its["fp32_flat_groups"])
    (group,) = mine["optimizer_state_dict"]["param_groups"]
    assert {key: group[key] for key in UPSTREAM_ZERO3_GROUP} == UPSTREAM_ZERO3_GROUP
    assert list(group) == list(its["optimizer_state_dict"]["param_groups"][0])
    (state,) = mine["optimizer_state_dict"]["state"].values()
    assert state["exp_avg"].shape == flat.shape and state["exp_avg_sq"].shape == flat.shape


def test_resumes_on_the_uninterrupted_losses(
    runs, ranks, zero3_run, shared_data, data_cache, tmp_path
):
    checkpoint = runs.checkpoint_at(zero3_run, SAVED_AT, tmp_path)
    resumed = _resume(runs, ranks, shared_data, data_cache, tmp_path, checkpoint)
    whole = runs.losses(zero3_run)
    assert resumed == {i: whole[i] for i in resumed}


def test_deepspeed_s_stage_3_resumes_our_files_through_mds_merge_mp(
    runs, ranks, zero3_run, deepspeed_file, shared_data, data_cache, tmp_path
):
    """Our files hold upstream's one parameter group (upstream's own DeepSpeed stage 3 loads them:
    test_deepspeed_contract); DeepSpeed's stage 3 as mds-train builds it keeps two, so it refuses
    them in one line naming the reshape, and resumes the reshaped copy."""
    from mds_checkpoint.cli import main

    checkpoint = runs.checkpoint_at(zero3_run, SAVED_AT, tmp_path)
    file = ("--deepspeed_config", str(deepspeed_file))
    refused = tmp_path / "refused"
    flags = ["--zero-stage", "3", "--load", str(checkpoint), *file]
    result = runs.train(_flags(runs, shared_data, data_cache, refused, *flags), nproc=ranks)
    assert result.returncode != 0
    assert "upstream's one parameter group" in result.stderr and "mds-merge-mp" in result.stderr
    reshaped = tmp_path / "reshaped"
    merged = runs.in_process(main, "merge", "--load", checkpoint, "--save", reshaped,
                             "--with-optimizer")  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    resumed = _resume(runs, ranks, shared_data, data_cache, tmp_path, reshaped, *file)
    whole = runs.losses(zero3_run)
    for iteration, loss in resumed.items():
        assert loss == pytest.approx(whole[iteration], rel=DEEPSPEED_RTOL), iteration
    if ranks == 2:  # the tolerance tells a loaded state from a lost one (once is enough)
        without_state = tmp_path / "without"
        without_state.mkdir()
        weights_only = ("--no-load-optim", *file)
        fresh = _resume(
            runs, ranks, shared_data, data_cache, without_state, reshaped, *weights_only
        )
        assert abs(fresh[ITERATIONS] / whole[ITERATIONS] - 1) > LOST_STATE


def test_resumes_deepspeed_s_stage_3_files(
    runs, ranks, deepspeed_run, shared_data, data_cache, tmp_path
):
    checkpoint = runs.checkpoint_at(deepspeed_run, SAVED_AT, tmp_path)
    resumed = _resume(runs, ranks, shared_data, data_cache, tmp_path, checkpoint)
    whole = runs.losses(deepspeed_run)
    for iteration, loss in resumed.items():
        assert loss == pytest.approx(whole[iteration], rel=DEEPSPEED_RTOL), iteration


def test_reshaped_files_resume_at_zero0_on_one_rank(
    runs, ranks, zero3_run, shared_data, data_cache, tmp_path
):
    """mds-merge-mp reads the partitions (mds_checkpoint's zero3) into a topology-free state a
    one-process ZeRO-0 run resumes."""
    from mds_checkpoint.cli import main

    if ranks == 1:
        pytest.skip("the DP = 2 partitions are the case that needs cutting and joining")
    reshaped = tmp_path / "reshaped"
    checkpoint = runs.checkpoint_at(zero3_run, SAVED_AT, tmp_path)
    result = runs.in_process(main, "merge", "--load", checkpoint, "--save", reshaped,
                             "--with-optimizer")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "resumed"
    flags = ["--zero-stage", "0", "--load", str(reshaped)]
    runs.train_ok(_flags(runs, shared_data, data_cache, out, *flags), nproc=1)
    resumed, whole = runs.losses(out), runs.losses(zero3_run)
    for iteration, loss in resumed.items():
        assert loss == pytest.approx(whole[iteration], rel=RESHAPED_RTOL), iteration


def test_sub_groups_are_deepspeed_s():
    """FullyShardedAdamW's sub-groups against DeepSpeed's own `_create_fp16_sub_groups` (a group
    is split where a parameter takes it to `sub_group_size` partition values or more)."""
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from mds_train.fully_sharded import DeepSpeedZero3Files

    sizes = [5, 7, 3, 9, 2, 6, 4]
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    for dp_size in (1, 2, 3):
        for sub_group_size in (1, 6, 10, 20, 1000):
            ours = DeepSpeedZero3Files()
            ours.param_groups = [{"params": params[:4]}, {"params": params[4:]}]
            ours._zero3_init(
                names={}, dp_group=None, dp_rank=0, dp_size=dp_size, sub_group_size=sub_group_size
            )
            for p in params:  # what DeepSpeed's partitioned parameters answer
                p.partition_numel = lambda p=p, n=dp_size: -(-p.numel() // n)
            its = types.SimpleNamespace(sub_group_size=sub_group_size)
            expected = [
                (g, sub)
                for g, group in enumerate(ours.param_groups)
                for sub in DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(
                    its, group["params"]
                )
            ]
            found = ours._sub_groups(2)  # as the optimizer's two groups
            assert [(g, [id(p) for p in sub]) for g, sub in found] == [
                (g, [id(p) for p in sub]) for g, sub in expected
            ], (dp_size, sub_group_size)
            # as upstream's one group, in module order (the order of the names)
            ours._names = {p: str(i) for i, p in enumerate(params)}
            one = DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(its, params)
            assert [[id(p) for p in sub] for _, sub in ours._sub_groups()] == [
                [id(p) for p in sub] for sub in one
            ], (dp_size, sub_group_size)


def test_partitions_of_another_parameter_order_are_refused():
    """The partitions' sizes do not tell their parameters' order: a model file whose
    param_shapes name another order (here two equal-sized weights swapped) is refused in one
    line naming the first difference; its own names load."""
    from mds_train.fully_sharded import SingleRankZero3AdamW

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).bfloat16()
    names = {p: n for n, p in model.named_parameters()}
    optimizer = SingleRankZero3AdamW(
        [{"params": list(model.parameters()), "lr": 0.1, "weight_decay": 0.0}],
        names=names, betas=(0.9, 0.95), eps=1e-8,
    )  # fmt: skip
    saved, shapes = optimizer.state_dict(), optimizer.param_shapes()
    optimizer.load_state_dict(saved, param_shapes=shapes)
    swapped = [dict(zip(["1.weight", "1.bias", "0.weight", "0.bias"], group.values(), strict=True))
               for group in shapes]  # fmt: skip
    with pytest.raises(ValueError, match=r"hold 1\.weight where this run's hold 0\.weight"):
        optimizer.load_state_dict(saved, param_shapes=swapped)
