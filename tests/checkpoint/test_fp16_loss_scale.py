"""fp16's dynamic loss scaler through a reshape: mds-merge-mp --with-optimizer records the scaler
that DeepSpeed's ZeRO partition files pickle (every rank's must agree). DeepSpeed refuses fp16 on
CPUs, so the files here are a real ZeRO-1 checkpoint's, doctored to hold an fp16 run's scaler."""

import json

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
    fp32_masters = torch.load(out / "global_step8/zero/final_layernorm.weight/fp32.pt")["param"]
    fp16_masters = torch.load(tmp_path / "a/global_step8/zero/final_layernorm.weight/fp32.pt")
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
