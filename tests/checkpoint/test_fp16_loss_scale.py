"""fp16's dynamic loss scaler through a reshape: mds-merge-mp --with-optimizer records the scaler
that DeepSpeed's ZeRO partition files pickle (every rank's must agree), and mds-train's restore
puts its state into the resuming run's DeepSpeed scaler. DeepSpeed refuses fp16 on CPUs, so the
files here are a real ZeRO-1 checkpoint's, doctored to hold an fp16 run's scaler; test_gpu_fp16.py
trains, reshapes and resumes in fp16 on two GPUs."""

import json

import pytest
import torch


def _fp16_scaler(*, cur_iter: int = 9):
    """DeepSpeed's dynamic scaler as an fp16 run leaves it: scale down from its start after an
    overflow, half its hysteresis used, some clean steps since."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(
        init_scale=2.0**16, scale_window=4, min_scale=1.0, delayed_shift=2,
        consecutive_hysteresis=False,
    )  # fmt: skip
    scaler.cur_scale, scaler.cur_iter = 2.0**13, cur_iter
    scaler.last_overflow_iter, scaler.cur_hysteresis = 6, 1
    return scaler


def _as_fp16_run(folder, copy, scalers):
    """A copy of a ZeRO-1 save folder whose partition files hold an fp16 run's loss scaler (the
    fp32 masters and moments in them are laid out as an fp16 run's)."""
    import shutil

    shutil.copytree(folder, copy)
    files = sorted(copy.glob("global_step*/zero_pp_rank_*_optim_states.pt"))
    assert len(files) == len(scalers) == 2
    for path, scaler in zip(files, scalers, strict=True):
        checkpoint = torch.load(path, weights_only=False)
        assert not checkpoint["optimizer_state_dict"]["dynamic_loss_scale"]  # fp32: static 1.0
        checkpoint["optimizer_state_dict"].update(loss_scaler=scaler, dynamic_loss_scale=True)
        torch.save(checkpoint, path)
    return copy


FP16_RECORD = {
    "cur_scale": 8192.0, "cur_iter": 9, "last_overflow_iter": 6, "cur_hysteresis": 1,
    "scale_factor": 2.0, "scale_window": 4, "min_scale": 1.0, "delayed_shift": 2,
    "consecutive_hysteresis": False,
}  # fmt: skip


def test_an_fp16_run_s_loss_scaler_is_carried(merge_mp, resumed_dp2, tmp_path):
    """ZeRO-1 partitions over 2 DP ranks with an fp16 run's dynamic scaler: meta.json's optimizer
    record keeps its state, a second reshape keeps it again, and an fp32 run's files (a static
    scaler of 1.0) record none."""
    source = resumed_dp2 / "ckpt"
    out = tmp_path / "fp32"
    assert merge_mp("--load", source, "--save", out, "--with-optimizer").returncode == 0
    meta = json.loads((out / "global_step8" / "meta.json").read_text())
    assert meta["optimizer"] == {"layout": "universal", "folder": "zero", "step": 8}

    fp16 = _as_fp16_run(source, tmp_path / "fp16", [_fp16_scaler(), _fp16_scaler()])
    result = merge_mp("--load", fp16, "--save", tmp_path / "a", "--with-optimizer")
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "a" / "global_step8" / "meta.json").read_text())
    assert meta["optimizer"]["loss_scaler"] == FP16_RECORD and meta["optimizer"]["step"] == 8
    norm = "global_step8/zero/language_model.encoder.final_layernorm.weight/fp32.pt"  # PP=1
    fp32_masters = torch.load(out / norm)["param"]
    fp16_masters = torch.load(tmp_path / "a" / norm)
    assert torch.equal(fp16_masters["param"], fp32_masters)

    args = ["--target-pipeline-model-parallel-size", "2", "--with-optimizer"]
    result = merge_mp("--load", tmp_path / "a", "--save", tmp_path / "b", *args)
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "b" / "global_step8" / "meta.json").read_text())
    assert meta["optimizer"]["loss_scaler"] == FP16_RECORD


def test_fp16_loss_scalers_that_disagree_are_refused(merge_mp, resumed_dp2, tmp_path):
    scalers = [_fp16_scaler(), _fp16_scaler(cur_iter=10)]
    fp16 = _as_fp16_run(resumed_dp2 / "ckpt", tmp_path / "fp16", scalers)
    result = merge_mp("--load", fp16, "--save", tmp_path / "out", "--with-optimizer")
    assert result.returncode == 1
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt: its fp16 loss scaler" in result.stderr
    assert "differs from zero_pp_rank_0_mp_rank_00_optim_states.pt's" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_scaler_reads_without_deepspeed_s_class(tmp_path):
    """ptfile unpickles DeepSpeed's scaler as a `Missing` record holding its attributes (it
    imports neither DeepSpeed nor torch); the record is the same as from the class itself."""
    from mds_checkpoint.loss_scale import loss_scaler_record
    from mds_checkpoint.ptfile import Missing

    stand_in = Missing()
    stand_in.__setstate__(dict(vars(_fp16_scaler())))
    state = {"loss_scaler": stand_in, "dynamic_loss_scale": True}
    assert loss_scaler_record(state, tmp_path / "f.pt") == FP16_RECORD
    del stand_in.state["cur_hysteresis"]
    with pytest.raises(ValueError, match="f.pt: dynamic_loss_scale is set but its loss_scaler"):
        loss_scaler_record(state, tmp_path / "f.pt")
    assert (
        loss_scaler_record({"loss_scaler": stand_in, "dynamic_loss_scale": False}, tmp_path) is None
    )


class _ZeroOptimizer:
    """What restore_loss_scaler touches of DeepSpeed's ZeRO-1/2/3 optimizers: `loss_scaler`."""

    def __init__(self, scaler):
        self.loss_scaler = scaler


def _run_scaler():
    """The resuming run's fresh scaler: --initial-loss-scale 2^16, --loss-scale-window 4,
    --hysteresis 2 (as ds_config derives them)."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

    args = {"init_scale": 2.0**16, "scale_window": 4, "min_scale": 1.0, "delayed_shift": 2,
            "consecutive_hysteresis": False}  # fmt: skip
    return CreateLossScaler(torch.float16, 0, True, args)


def test_restore_puts_the_state_into_the_run_s_dynamic_scaler():
    from mds_train.reshaped import restore_loss_scaler

    scaler = _run_scaler()
    assert restore_loss_scaler(_ZeroOptimizer(scaler), FP16_RECORD)
    reference = _fp16_scaler()
    for name in ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"):
        assert getattr(scaler, name) == getattr(reference, name), name
    assert scaler.scale_window == 4 and scaler.delayed_shift == 2  # the run's settings
    # It goes on as the saved scaler would: clean steps until the window since the last overflow
    # (at 6) is full, then the scale doubles and the hysteresis refills, at the same iteration.
    scales = []
    for _ in range(4):
        for each in (scaler, reference):
            each.update_scale(False)
        assert vars(scaler) == vars(reference)
        scales.append(scaler.cur_scale)
    assert scales == [8192.0, 8192.0, 16384.0, 16384.0] and scaler.cur_hysteresis == 2


def test_restore_leaves_runs_without_a_dynamic_scaler_alone():
    """A static --loss-scale run (and bf16/fp32: DeepSpeed's static 1.0), a bf16 ZeRO-0 run's
    MasterWeightAdamW without any scaler, and a source without a scaler: nothing changes."""
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    from mds_train.reshaped import restore_loss_scaler

    static = CreateLossScaler(torch.float16, 1024.0, False, None)
    assert not restore_loss_scaler(_ZeroOptimizer(static), FP16_RECORD)
    assert static.cur_scale == 1024.0
    assert not restore_loss_scaler(object(), FP16_RECORD)
    fresh = _run_scaler()
    assert not restore_loss_scaler(_ZeroOptimizer(fresh), None)
    assert fresh.cur_scale == 2.0**16 and fresh.cur_iter == 0


def test_restore_refuses_a_record_without_the_scaler_s_state():
    from mds_train.reshaped import restore_loss_scaler

    record = {k: v for k, v in FP16_RECORD.items() if k != "cur_hysteresis"}
    with pytest.raises(ValueError, match="loss_scaler record has no cur_hysteresis"):
        restore_loss_scaler(_ZeroOptimizer(_run_scaler()), record)
