"""mds-train's FP8 flags: upstream's Transformer-Engine spellings (megatron/arguments.py,
`_add_transformer_engine_args`) become mds_model's recipe, mistakes and machines without FP8 tensor
cores get one line, and on a GPU (-m gpu) an FP8 run follows the bf16 run and resumes exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from mds_model.fp8 import Fp8Recipe
from mds_train.cli import build_config
from mds_train.config import Topology

from .test_config import DATA, parse

TINY = [
    *DATA,
    *"--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32".split(),
    *"--micro-batch-size 2 --lr 1e-3 --train-iters 5 --bf16".split(),
]
ONE = Topology(world_size=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def test_upstreams_flags_make_the_recipe():
    config = build_config(parse(TINY))
    assert config.precision.fp8_recipe() is None
    argv = [
        *TINY,
        *"--fp8-hybrid --fp8-margin 1 --fp8-interval 2 --fp8-amax-history-len 16".split(),
        *"--fp8-amax-compute-algo max --no-fp8-wgrad".split(),
    ]
    assert build_config(parse(argv)).precision.fp8_recipe() == Fp8Recipe(
        "hybrid",
        margin=1,
        interval=2,
        amax_history_len=16,
        amax_compute_algo="max",
        fp8_wgrad=False,
    )
    e4m3 = build_config(parse([*TINY, "--fp8-e4m3"])).precision.fp8_recipe()
    assert e4m3 == Fp8Recipe("e4m3")  # upstream's defaults: margin 0, interval 1, history 1
    build_config(parse([*TINY, "--fp8-e4m3"])).validate(ONE)


def test_transformer_impl_is_accepted_with_a_note():
    from mds_train.megatron_flags import megatron_flags_given

    values = parse([*TINY, "--transformer-impl", "transformer_engine", "--fp8-hybrid"])
    notes = megatron_flags_given(values)
    assert any("--transformer-impl" in note and "FP8" in note for note in notes), notes


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("--fp8-e4m3 --fp8-hybrid", "give --fp8-e4m3 or --fp8-hybrid, not both"),
        ("--fp8-hybrid --fp8-interval 0", "--fp8-interval must be 1 or more; got 0"),
        ("--fp8-hybrid --fp8-amax-history-len 0", "--fp8-amax-history-len must be 1 or more"),
    ],
)
def test_flag_mistakes_get_one_line(capsys, given, message):
    from mds_train.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, *given.split()])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("mds-train: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "topology", "message"),
    [
        (
            [flag for flag in TINY if flag != "--bf16"] + ["--fp8-hybrid"],
            ONE,
            "--fp8-hybrid needs --bf16 or --fp16",
        ),
        (
            [*TINY, "--fp8-e4m3", "--tensor-model-parallel-size", "8"],
            Topology(world_size=8, tensor_model_parallel_size=8, pipeline_model_parallel_size=1),
            "--fp8-e4m3: --hidden-size / --tensor-model-parallel-size is 8, not a multiple of 16",
        ),
        (
            [*TINY, "--fp8-hybrid", "--ffn-hidden-size", "72"],
            ONE,
            "--ffn-hidden-size / --tensor-model-parallel-size is 72",
        ),
        (
            [*TINY, "--fp8-hybrid", "--micro-batch-size", "1", "--seq-length", "24"],
            ONE,
            "--micro-batch-size x --seq-length is 24",
        ),
    ],
)
def test_shapes_fp8_gemms_cannot_take_are_refused(argv, topology, message):
    with pytest.raises(ValueError, match=message):
        build_config(parse(argv)).validate(topology)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without FP8 tensor cores")
def test_a_machine_without_fp8_tensor_cores_refuses_in_one_line(capsys, shared_data):
    from mds_train.cli import main

    tokenizer = ["--vocab-file", str(shared_data / "gpt2-vocab.json")]
    tokenizer += ["--merge-file", str(shared_data / "gpt2-merges.txt")]
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, *tokenizer, "--fp8-hybrid"])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "mds-train: error: --fp8-hybrid: FP8 training needs a GPU with FP8 tensor cores (Hopper "
        "or Ada, compute capability 8.9 or newer); there is none here: drop the --fp8-* flags\n"
    )


# --- on the GPU --------------------------------------------------------------------------------


def gpu_flags(runs, shared_data, cache, out: Path, *extra: str) -> list[str]:
    """A model FP8 GEMMs take (hidden 128, 512 tokens a micro-batch), bf16, no dropout."""
    return [
        *"--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64".split(),
        *"--micro-batch-size 8 --global-batch-size 16 --bf16".split(),
        *runs.OPTIMIZER,
        *runs.NO_DROPOUT,
        *runs.data_flags(shared_data, cache),
        *"--train-iters 12 --log-interval 1 --eval-interval 100 --eval-iters 1".split(),
        "--output-dir",
        str(out),
        *extra,
    ]


@pytest.mark.gpu
def test_gpu_fp8_run_follows_bf16_and_resumes_exactly(runs, shared_data, data_cache, tmp_path):
    """The FP8 run's losses stay within 2% of the bf16 run's (E4M3/E5M2 rounding, delayed scales);
    a run stopped at iteration 6 and resumed gives the uninterrupted run's losses bit for bit:
    the saved amaxes, history and scales are the ones the next step casts with."""
    bf16, whole, parts, save = (tmp_path / name for name in ("bf16", "whole", "parts", "ckpt"))
    fp8 = ("--fp8-hybrid", "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max")
    assert runs.train(gpu_flags(runs, shared_data, data_cache, bf16)).returncode == 0
    result = runs.train(gpu_flags(runs, shared_data, data_cache, whole, *fp8))
    assert result.returncode == 0, result.stderr[-3000:]
    first = gpu_flags(runs, shared_data, data_cache, parts, *fp8, "--save", str(save))
    assert runs.train([*first, "--exit-interval", "6"]).returncode == 0
    assert (save / "global_step6" / "fp8_scaling_rank00000.pt").is_file()
    resumed = runs.train([*first, "--load", str(save)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "FP8 scales start afresh" not in resumed.stderr
    reference, ours, split = runs.losses(bf16), runs.losses(whole), runs.losses(parts)
    assert [split[i] for i in range(7, 13)] == [ours[i] for i in range(7, 13)]
    for iteration in range(1, 13):
        assert abs(ours[iteration] - reference[iteration]) < 0.02 * reference[iteration]
    assert ours[12] < ours[1]
    meta = json.loads((save / "global_step12" / "meta.json").read_text())
    assert meta["iteration"] == 12
