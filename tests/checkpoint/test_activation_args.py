"""The GeLU of a checkpoint upstream wrote, read from its pickled `args` as upstream's ParallelMLP
picks it (megatron/model/transformer.py), and the args mds writes for upstream's readers: upstream
reads them back to the same GeLU, Hugging Face's converter to the same function."""

import argparse

import pytest
from mds_checkpoint.describe import activation_from_args, config_from_megatron_args
from mds_checkpoint.upstream_state import megatron_args
from mds_common.tokenizer_record import TokenizerRecord
from mds_model import GPTConfig


def upstream_args(argv: list[str]) -> argparse.Namespace:
    """The namespace upstream pickles, for its three GeLU flags (megatron/arguments.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--openai-gelu", action="store_true")
    parser.add_argument("--onnx-safe", type=bool, required=False)
    parser.add_argument("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion")
    return parser.parse_args(argv)


# ParallelMLP: openai_gelu -> openai_gelu (tanh); elif onnx_safe -> erf_gelu (exact); else
# bias_gelu_fusion -> the fused bias_gelu (tanh), or F.gelu (exact).
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "gelu_tanh"),
        (["--no-bias-gelu-fusion"], "gelu"),
        (["--openai-gelu"], "gelu_tanh"),
        (["--openai-gelu", "--no-bias-gelu-fusion"], "gelu_tanh"),
        (["--onnx-safe", "1"], "gelu"),
        (["--onnx-safe", "False"], "gelu"),  # type=bool: bool("False") is True
        (["--onnx-safe", "1", "--openai-gelu"], "gelu_tanh"),
    ],
)
def test_args_give_upstream_s_gelu(argv, expected):
    assert activation_from_args(upstream_args(argv), where="f") == expected


def test_absent_fields_take_upstream_s_defaults():
    """Older files pickle fewer fields: the defaults of arguments.py (bias_gelu_fusion True)."""
    assert activation_from_args(argparse.Namespace(), where="f") == "gelu_tanh"
    assert activation_from_args(argparse.Namespace(bias_gelu_fusion=False), where="f") == "gelu"


def test_the_golden_s_args_give_the_exact_gelu():
    """The golden README's run: --no-bias-gelu-fusion, no --openai-gelu."""
    args = upstream_args(["--no-bias-gelu-fusion"])
    args.__dict__.update(num_layers=2, hidden_size=16, num_attention_heads=4, padded_vocab_size=512)
    config = config_from_megatron_args(
        args, checkpoint_info=None, tensor_model_parallel_size=1, where="f"
    )
    assert config.activation == "gelu"


@pytest.mark.parametrize("name", ["squared_relu", "glu_activation"])
def test_mlps_other_than_a_gelu_or_swiglu_are_refused_in_one_line(name):
    args = argparse.Namespace(
        num_layers=2, hidden_size=16, num_attention_heads=4, padded_vocab_size=512
    )
    setattr(args, name, "geglu" if name == "glu_activation" else True)
    with pytest.raises(ValueError) as error:
        config_from_megatron_args(
            args, checkpoint_info=None, tensor_model_parallel_size=1, where="f.pt"
        )
    message = str(error.value)
    assert message.startswith(f"f.pt: Megatron's args set {name}=") and "\n" not in message
    assert "an MLP mds GPTs do not compute" in message


def hf_converter_activation(args: argparse.Namespace) -> str:
    """transformers' convert_megatron_gpt2_checkpoint.py."""
    if args.bias_gelu_fusion:
        return "gelu_fast"
    if args.openai_gelu:
        return "gelu_new"
    return "gelu"


@pytest.mark.parametrize(("activation", "hf_name"), [("gelu_tanh", "gelu_new"), ("gelu", "gelu")])
def test_written_args_read_back_as_the_same_gelu(activation, hf_name):
    config = GPTConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, vocab_size=100, activation=activation
    )
    args = megatron_args(
        config,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        progress={},
        tokenizer=TokenizerRecord(),
        layout="deepspeedai",
    )
    assert activation_from_args(args, where="f") == activation
    assert hf_converter_activation(args) == hf_name
    read = config_from_megatron_args(
        args, checkpoint_info=None, tensor_model_parallel_size=1, where="f"
    )
    assert read.activation == activation
