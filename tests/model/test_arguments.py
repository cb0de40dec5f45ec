"""mds_model.arguments: the rows of upstream's names for GPTConfig's fields read back what they
write (Megatron's args, Hugging Face GPT-2's config.json), and the GeLU rule and the activation
table each have one inverse."""

import argparse
import dataclasses

import pytest
from mds_model.arguments import (
    ARGUMENTS,
    BIGSCIENCE_POSITIONS,
    HF_ACTIVATION_OF,
    HF_ACTIVATIONS,
    MEGATRON_POSITIONS,
    POSITION_OF_BIGSCIENCE,
    POSITION_OF_MEGATRON,
    activation_of,
    fields_from_args,
    fields_from_hf_gpt2,
    gelu_args,
    hf_gpt2_fields,
    written_args,
)
from mds_model.config import ACTIVATIONS, ARCHITECTURE, POSITION_EMBEDDING_TYPES, GPTConfig

CONFIGS = [
    GPTConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000),
    GPTConfig(
        num_layers=3,
        hidden_size=48,
        num_attention_heads=6,
        vocab_size=500,
        seq_length=64,
        ffn_hidden_size=96,
        max_position_embeddings=128,
        make_vocab_size_divisible_by=8,
        layernorm_epsilon=1e-6,
        hidden_dropout=0.0,
        attention_dropout=0.05,
        init_method_std=0.01,
        embed_layernorm=True,
        activation="gelu",
    ),
]


def rows_config(config: GPTConfig, fields: dict) -> dict:
    """The rows' fields of a config read back, sizes as their derived values."""
    rebuilt = dataclasses.replace(config, **fields)
    return {a.field: a.value(rebuilt) for a in ARGUMENTS}


def test_every_row_is_a_field_and_every_architecture_field_outside_the_run_has_a_row():
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    assert {a.field for a in ARGUMENTS} <= fields
    # the three with other readers: the vocabulary's (padded_vocab_size, checkpoint_info), the
    # position type's (upstream's two spellings, below) and the activation's (the GeLU flags)
    unread = set(GPTConfig.fields_of_kind(ARCHITECTURE)) - {a.field for a in ARGUMENTS}
    assert unread == {"vocab_size", "pad_vocab_size_to", "position_embedding_type", "activation"}


@pytest.mark.parametrize("config", CONFIGS, ids=["gpt2", "bloom-like"])
def test_megatron_args_read_back_what_they_wrote(config):
    args = argparse.Namespace(**written_args(config))
    read = fields_from_args(args)
    assert rows_config(config, read) == {a.field: a.value(config) for a in ARGUMENTS}
    assert (
        activation_of(
            openai_gelu=args.openai_gelu,
            onnx_safe=args.onnx_safe,
            bias_gelu_fusion=args.bias_gelu_fusion,
        )
        == config.activation
    )
    assert args.swiglu is False and args.normalization == "layernorm"
    assert args.num_key_value_heads == config.num_attention_heads and args.add_bias_linear


@pytest.mark.parametrize("config", CONFIGS, ids=["gpt2", "bloom-like"])
def test_hf_gpt2_keys_read_back_what_they_wrote(config):
    hf = hf_gpt2_fields(config)
    assert set(hf) == {
        "n_layer",
        "n_embd",
        "n_head",
        "n_inner",
        "n_positions",
        "layer_norm_epsilon",
        "resid_pdrop",
        "attn_pdrop",
        "initializer_range",
    }
    assert rows_config(config, fields_from_hf_gpt2(hf))["ffn_hidden_size"] == config.ffn_size


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_the_gelu_rule_and_its_inverse(activation):
    assert activation_of(**gelu_args(activation)) == activation


def test_one_activation_table_both_ways():
    assert HF_ACTIVATION_OF == {"gelu_tanh": "gelu_new", "gelu": "gelu"}
    assert all(HF_ACTIVATIONS[name] == act for act, name in HF_ACTIVATION_OF.items())


def test_position_names_both_ways():
    assert set(MEGATRON_POSITIONS) == set(BIGSCIENCE_POSITIONS) == set(POSITION_EMBEDDING_TYPES)
    for position in POSITION_EMBEDDING_TYPES:
        assert POSITION_OF_MEGATRON[MEGATRON_POSITIONS[position]] == position
        assert POSITION_OF_BIGSCIENCE[BIGSCIENCE_POSITIONS[position]] == position
    assert POSITION_OF_MEGATRON["absolute"] == "learned"  # bigscience's flag spelling


def test_megatron_core_s_normalization_spelling_reads():
    read = fields_from_args(argparse.Namespace(normalization="LayerNorm"))
    assert read == {"normalization": "layernorm"}


# Upstream's Llama flag block (examples_deepspeed/pretrain_llama2_distributed.sh), with 2
# key/value heads.
LLAMA_FLAGS = (
    "--use-rotary-position-embeddings --untie-embeddings-and-output-weights --swiglu "
    "--normalization rmsnorm --disable-bias-linear --num-key-value-heads 2"
).split()


def test_every_row_s_flag_is_a_gpt_flag():
    """mds-train and mds-model info take each architecture row's flag (and --swiglu) from
    GPTFlags; the rows of how a run computes (dropout, the initial weights) are mds-train's."""
    from mds_common.flags import flag_fields
    from mds_model.arguments import SWIGLU
    from mds_model.config import KIND, RUN
    from mds_model.flags import GPTFlags

    names = {name for _, spec in flag_fields(GPTFlags) for name in spec.names}
    fields = GPTConfig.__dataclass_fields__
    rows = [a for a in ARGUMENTS if fields[a.field].metadata[KIND] != RUN]
    assert {argument.flag for argument in (*rows, SWIGLU)} <= names


@pytest.mark.parametrize("tensor_parallel", [1, 2])
def test_mds_model_info_counts_a_llama_as_the_model_holds_it(tensor_parallel, capsys):
    """mds-model info with upstream's Llama block: the GPT it describes (grouped QKV, SwiGLU's
    [gate; up] rows, no linear or norm biases, the untied output layer) has that many
    parameters, the output layer counted as an embedding."""
    import json

    from mds_model import GPT
    from mds_model.cli import main

    argv = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64".split()
    argv += [*LLAMA_FLAGS, "--vocab-size", "1000", "--json"]
    argv += ["--tensor-model-parallel-size", str(tensor_parallel)]
    with pytest.raises(SystemExit) as exit_:
        main(["info", *argv])
    assert exit_.value.code == 0
    figures = json.loads(capsys.readouterr().out)
    config = GPTConfig.preset("llama", **figures["config"])
    model = GPT(config)
    assert figures["parameters"] == model.num_parameters() == 205_120
    assert figures["parameters_without_embeddings"] == model.num_parameters(exclude_embeddings=True)


def test_mds_model_info_names_upstream_s_flag_in_a_config_error(capsys):
    from mds_model.cli import main

    argv = "info --num-layers 2 --hidden-size 64 --num-attention-heads 4 --vocab-size 100".split()
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--num-key-value-heads", "1", "--tensor-model-parallel-size", "2"])
    assert exit_.value.code == 1
    assert capsys.readouterr().err == (
        "mds-model info: error: --num-key-value-heads (1) must be divisible by "
        "--tensor-model-parallel-size (2)\n"
    )
