"""The MLP's GeLU follows upstream's flags: `--openai-gelu`, `--onnx-safe`, `--no-bias-gelu-fusion`
pick the function Megatron-DeepSpeed's ParallelMLP applies, meta.json records it, and a checkpoint
of the other GeLU is one line."""

import argparse
import json

import pytest
import torch
import torch.nn.functional as F
import typer
from mds_checkpoint.meta import CheckpointMeta, Parallel
from mds_common.argv import normalise, option_specs
from mds_model import kernels
from mds_train.checkpointing import check_compatible
from mds_train.cli import build_config, make_app

REQUIRED = [
    *"--data-path D --vocab-file v.json --merge-file m.txt --num-layers 2 --hidden-size 8".split(),
    *"--num-attention-heads 2 --seq-length 8 --micro-batch-size 2 --lr 1e-3".split(),
]


def upstream_mlp_gelu(argv: list[str]):
    """The function upstream's ParallelMLP applies to x + bias for these flags: its argparse lines
    (megatron/arguments.py at 6acc370a) and its choice (megatron/model/transformer.py), with its
    formulas (megatron/model/utils.py, megatron/model/fused_bias_gelu.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--openai-gelu", action="store_true")
    parser.add_argument("--onnx-safe", type=bool, required=False)
    parser.add_argument("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion")
    args, _ = parser.parse_known_args(argv)

    def openai_gelu(x):  # utils.gelu_impl
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))

    def erf_gelu(x):  # utils.erf_gelu
        return x * 0.5 * (torch.erf(x / 1.41421).to(dtype=x.dtype) + torch.ones_like(x))

    def bias_gelu(x):  # fused_bias_gelu.bias_gelu, bias already added
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    if args.openai_gelu:
        return openai_gelu
    if args.onnx_safe:
        return erf_gelu
    return bias_gelu if args.bias_gelu_fusion else F.gelu


def mds_config(argv: list[str]):
    command = typer.main.get_command(make_app())
    args = normalise([*REQUIRED, *argv], option_specs(command)).args
    with command.make_context("mds-train", args) as ctx:
        config = build_config(dict(ctx.params))
    return config.model.gpt_config(
        vocab_size=100, tensor_model_parallel_size=1, params_dtype="float32"
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--no-bias-gelu-fusion"],
        ["--openai-gelu"],
        ["--openai-gelu", "--no-bias-gelu-fusion"],
        ["--onnx-safe", "1"],
        ["--onnx-safe", "False"],  # argparse's type=bool: any non-empty string is True
        ["--onnx-safe", ""],
        ["--onnx-safe", "1", "--openai-gelu"],
        ["--onnx-safe", "1", "--no-bias-gelu-fusion"],
    ],
)
def test_flags_choose_upstream_s_gelu(argv):
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    expected = upstream_mlp_gelu(argv)(x)
    config = mds_config(argv)
    ours = kernels.bias_gelu(
        x, torch.zeros(1, dtype=x.dtype).expand(x.shape[-1]).contiguous(),
        approximate=config.gelu_approximate, use_kernel=False,
    )  # fmt: skip
    # erf_gelu's 1.41421 for sqrt(2) and bias_gelu's 0.79788456 move them by < 2e-6 and 1e-9;
    # the two GeLUs differ by up to 4.7e-4.
    torch.testing.assert_close(ours, expected, rtol=0, atol=2e-6)
    assert config.activation == ("gelu" if config.gelu_approximate == "none" else "gelu_tanh")


def test_the_default_stays_upstream_s_fused_tanh_gelu():
    assert mds_config([]).activation == "gelu_tanh"
    assert mds_config(["--no-bias-gelu-fusion"]).activation == "gelu"


def _meta(**model):
    shape = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_size": 256}
    parallel = Parallel(data_parallel_size=1, world_size=1)
    return CheckpointMeta(model={**shape, **model}, parallel=parallel)


def test_a_checkpoint_of_the_other_gelu_is_one_line(tmp_path):
    exact, tanh = _meta(activation="gelu"), _meta(activation="gelu_tanh")
    with pytest.raises(ValueError) as error:
        check_compatible(exact, tanh, path=tmp_path, loads_optimizer=True)
    assert str(error.value) == (
        f"{tmp_path}: activation is gelu in the checkpoint but gelu_tanh in this run; add "
        "--no-bias-gelu-fusion (the flags of the run that wrote it)"
    )
    with pytest.raises(ValueError, match="drop --no-bias-gelu-fusion and --onnx-safe, or add "):
        check_compatible(tanh, exact, path=tmp_path, loads_optimizer=False)
    # meta.json written before the field existed: mds computed the tanh GeLU.
    check_compatible(_meta(), tanh, path=tmp_path, loads_optimizer=True)
    with pytest.raises(ValueError, match="activation is gelu_tanh in the checkpoint but gelu "):
        check_compatible(_meta(), exact, path=tmp_path, loads_optimizer=True)


def test_meta_json_records_the_gelu_and_a_resume_must_match(
    runs, shared_data, data_cache, tmp_path
):
    save = tmp_path / "ckpt"
    flags = [
        *runs.MODEL, *runs.OPTIMIZER, *runs.data_flags(shared_data, data_cache),
        *"--train-iters 1 --lr-decay-iters 10 --log-interval 1 --eval-iters 0".split(),
        "--save", str(save),
    ]  # fmt: skip
    result = runs.train([*flags, "--no-bias-gelu-fusion"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--no-bias-gelu-fusion is accepted and ignored" not in result.stderr
    meta = json.loads((save / "global_step1/meta.json").read_text())
    assert meta["model"]["activation"] == "gelu"
    resumed = runs.train([*flags, "--train-iters", "2", "--load", str(save)])
    assert resumed.returncode == 1
    assert resumed.stderr.strip().splitlines()[-1] == (
        f"mds-train: error: {save / 'global_step1'}: activation is gelu in the checkpoint but "
        "gelu_tanh in this run; add --no-bias-gelu-fusion (the flags of the run that wrote it)"
    )
