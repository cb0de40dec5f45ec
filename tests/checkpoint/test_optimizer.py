"""--with-optimizer: a TP=2 run's checkpoint reshaped with its fp32 masters and Adam moments resumes
at PP=2 (pipeline engine) and at DP=2 with ZeRO-1 and ZeRO-3, a ZeRO-3 run's at TP=2 with ZeRO-3,
and the losses continue as the uninterrupted runs'; the optimizer states of all engines read
alike; ZeRO-3 crossings without a reshape."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from mds_checkpoint import UniversalState
from mds_checkpoint.arrays import as_tensor
from mds_checkpoint.engine_names import engine_parameter_name
from mds_checkpoint.optimizer_read import OptimizerState
from mds_checkpoint.source import merged_part, open_source

# fp32 reduction order differs between TP=2, PP=2 and DP=2 (the uninterrupted runs of the
# equivalence tests agree to 2e-5); the resumed losses match to about 1e-7 on CPU.
RTOL = 2e-5


def _check_continues(runs, whole_run, resumed_run, iterations=(5, 6, 7, 8)):
    whole, resumed = runs.losses(whole_run), runs.losses(resumed_run)
    assert sorted(resumed) == list(iterations)
    for iteration, loss in resumed.items():
        assert loss == pytest.approx(whole[iteration], rel=RTOL), iteration
    assert resumed[iterations[-1]] < whole[1]  # still learning


def test_resumed_at_pp2_continues_the_loss(runs, tp2_run, resumed_pp2):
    _check_continues(runs, tp2_run, resumed_pp2)
    meta = json.loads((resumed_pp2 / "reshaped" / "global_step4" / "meta.json").read_text())
    assert meta["optimizer"] == {"layout": "universal", "folder": "zero", "step": 4}
    assert (
        meta["reshaped"]["tensor_model_parallel_size"] == 2
        and meta["parallel"]["pipeline_model_parallel_size"] == 2
    )


def test_resumed_at_dp2_with_zero1_continues_the_loss(runs, tp2_run, resumed_dp2):
    _check_continues(runs, tp2_run, resumed_dp2)
    partitions = sorted((resumed_dp2 / "ckpt" / "global_step8").glob("zero_pp_rank_*"))
    assert [p.name for p in partitions] == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    ]


def test_resumed_at_dp2_with_zero3_continues_the_loss(runs, tp2_run, resumed_zero3):
    """DeepSpeed's stage-3 partitions filled from the reshaped files: weights, masters, moments."""
    _check_continues(runs, tp2_run, resumed_zero3)
    meta = json.loads((resumed_zero3 / "ckpt" / "global_step8" / "meta.json").read_text())
    assert meta["parallel"]["zero_stage"] == 3 and meta["parallel"]["data_parallel_size"] == 2


def test_zero3_run_reshaped_to_tp2_continues_the_loss(runs, zero3_run, zero3_resumed_tp2):
    """A ZeRO-3 DP=2 run's partitions (read by zero3.py) resume at TP=2, ZeRO-3."""
    _check_continues(runs, zero3_run, zero3_resumed_tp2, iterations=(4, 5, 6))
    meta = json.loads((zero3_resumed_tp2 / "reshaped" / "global_step3" / "meta.json").read_text())
    assert meta["reshaped"]["layout"] == "zero3" and meta["optimizer"]["step"] == 3


def _state(folder):
    source = open_source(folder)
    weights = {}
    for part in source.parts():
        weights.update(merged_part(source, part))
    return OptimizerState(source, weights.__getitem__)


@pytest.mark.parametrize(
    "name",
    ["embedding.word_embeddings.weight", "layers.2.self_attention.query_key_value.weight",
     "layers.3.mlp.dense_4h_to_h.weight", "final_layernorm.bias"],
)  # fmt: skip
def test_every_engine_s_state_reads_alike(tp2_run, resumed_pp2, resumed_dp2, resumed_zero3, name):
    """Iteration 8 reached four ways: torch's AdamW at TP=2 (mp_rank files), the pipeline's
    AdamW per stage, ZeRO-1's and ZeRO-3's flat partitions over 2 DP ranks."""
    whole = _state(tp2_run / "checkpoints")
    assert whole.step == 8
    expected = whole.read(name)
    for other in (resumed_pp2 / "ckpt", resumed_dp2 / "ckpt", resumed_zero3 / "ckpt"):
        state = _state(other)
        assert state.step == 8
        for key, tensor in state.read(name).items():
            torch.testing.assert_close(
                as_tensor(tensor), as_tensor(expected[key]), rtol=1e-3, atol=1e-7
            )


def test_the_bf16_optimizer_partitions_of_tp2_pp2(merge_mp, tp2pp2_checkpoint, tmp_path):
    """DeepSpeed's BF16 optimizer at TP=2 x PP=2: fp32 masters cast to bf16 are the weights."""
    out = tmp_path / "reshaped"
    result = merge_mp("--load", tp2pp2_checkpoint, "--save", out, "--with-optimizer")
    assert result.returncode == 0, result.stderr
    zero = out / "global_step2" / "zero"
    assert torch.load(zero / "optimizer_state.pt")["step"] == 2
    assert (out / "latest_universal").read_text() == "global_step2"
    source = open_source(out)
    for part in source.parts():
        for name, weight in merged_part(source, part).items():
            # named as the PP=1 target's plain engine names them (DeepSpeed's param_names)
            folder = zero / engine_parameter_name(name, num_layers=4, pipeline=False)
            record = torch.load(folder / "fp32.pt")
            assert record["param"].dtype == torch.float32
            assert torch.equal(record["param"].to(torch.bfloat16), as_tensor(weight)), name
            moments = torch.load(folder / "exp_avg_sq.pt")["param"]
            assert moments.shape == weight.shape and moments.abs().sum() > 0, name
            assert torch.load(folder / "step.pt") == torch.tensor(2.0)
    qkv = "language_model.encoder.layers.0.self_attention.query_key_value.weight"
    assert torch.load(zero / qkv / "exp_avg.pt")["cat_dim"] == 0
    words = torch.load(zero / "language_model.embedding.word_embeddings.weight" / "fp32.pt")
    assert words["vocab_tensor"] and words["param"].shape == (5120, 64)
    again = tmp_path / "again"  # a reshaped checkpoint reshapes again, optimizer state included
    args = ["--target-pipeline-model-parallel-size", "4", "--with-optimizer"]
    result = merge_mp("--load", out, "--save", again, *args)
    assert result.returncode == 0, result.stderr
    # at PP=4 the pipeline engine's names; the same states under them
    assert (again / "global_step2/zero/tied_modules.embed.word_embeddings.weight").is_dir()
    first, second = UniversalState(out / "global_step2"), UniversalState(again / "global_step2")
    assert (first.step, first.param_groups) == (second.step, second.param_groups)
    assert sorted(first.names()) == sorted(second.names())
    for name in first.names():
        for key, value in first.read(name).items():
            assert np.array_equal(value, second.read(name)[key]), (name, key)


def test_weights_only_reshape_refuses_to_resume_silently(merge_mp, tp2_run, tmp_path):
    """mds-train's check before it builds anything: no optimizer state, no silent fresh Adam."""
    from mds_train.checkpointing import check_compatible, find_checkpoint

    out = tmp_path / "weights-only"
    result = merge_mp("--load", tp2_run / "checkpoints", "--iteration", "4", "--save", out)
    assert result.returncode == 0, result.stderr
    path, meta = find_checkpoint(out)
    run_meta = meta.replace(
        parallel=dataclasses.replace(meta.parallel, zero_stage=1), reshaped=None
    )
    with pytest.raises(ValueError, match="holds no optimizer state; add --no-load-optim"):
        check_compatible(meta, run_meta, path=path, loads_optimizer=True)
    check_compatible(meta, run_meta, path=path, loads_optimizer=False)


def test_zero3_crossings_without_a_reshape_say_what_to_do(tp2_run):
    """A ZeRO-3 checkpoint's weights exist only in its partitions, and DeepSpeed's ZeRO-3 loader
    reads only those: between ZeRO-3 and stages 0-2 only weights go in, and only into ZeRO-3."""
    from mds_train.checkpointing import check_compatible, find_checkpoint

    path, meta = find_checkpoint(tp2_run / "checkpoints")  # saved at ZeRO-0
    at_zero3 = meta.replace(parallel=dataclasses.replace(meta.parallel, zero_stage=3))
    with pytest.raises(ValueError, match="saved at ZeRO-0 and this run is at ZeRO-3; add --no-lo"):
        check_compatible(meta, at_zero3, path=path, loads_optimizer=True)
    check_compatible(meta, at_zero3, path=path, loads_optimizer=False)
    saved_at_zero3 = at_zero3
    for loads_optimizer in (True, False):
        with pytest.raises(ValueError, match="saved at ZeRO-3, whose weights exist only in its"):
            check_compatible(saved_at_zero3, meta, path=path, loads_optimizer=loads_optimizer)


def test_zero0_checkpoint_s_weights_load_at_zero3(runs, train_flags, tp2_run, tmp_path):
    """--no-load-optim at ZeRO-3 from a TP=2 ZeRO-0 checkpoint (iteration 4): the weights go into
    the stage-3 partitions, so the first loss is the uninterrupted run's at iteration 5 (the same
    weights on the same batch); DeepSpeed's own loader stopped on an assertion here."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    shutil.copytree(tp2_run / "checkpoints" / "global_step4", checkpoints / "global_step4")
    (checkpoints / "latest").write_text("global_step4")
    out = tmp_path / "run"
    flags = ["--tensor-model-parallel-size", "2", "--zero-stage", "3", "--no-load-optim"]
    flags += ["--load", str(checkpoints)]
    result = runs.train(train_flags(out, *flags, iterations=5), nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = runs.losses(out)
    assert list(resumed) == [5]
    assert resumed[5] == pytest.approx(runs.losses(tp2_run)[5], rel=RTOL)
