"""GPTConfig: Megatron's vocab padding table (reference 3.6), validation errors naming the field."""

import dataclasses
import re

import pytest
from mds_model.config import (
    ARCHITECTURE,
    ARCHITECTURES,
    GPT2,
    KIND,
    RUN,
    TUNABLE,
    GPTConfig,
    check_tensor_parallel,
    for_tensor_parallel,
    padded_vocab_size,
)


def config(**overrides) -> GPTConfig:
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=50257)
    base.update(overrides)
    return GPTConfig(**base)


@pytest.mark.parametrize("tp, padded", [(1, 50304), (2, 50432), (4, 50688), (8, 51200)])
def test_vocab_padding_table(tp, padded):
    assert padded_vocab_size(50257, tensor_model_parallel_size=tp) == padded
    made = for_tensor_parallel(config(num_attention_heads=8), tp)
    # the rows a run at this TP makes are recorded: the config holds no parallel size
    assert made.padded_vocab_size == padded and made.pad_vocab_size_to == (
        None if tp == 1 else padded
    )
    assert for_tensor_parallel(made, 1) == made  # rows, once made, stay (a reshape keeps them)


def test_divisible_by_1024_at_tp1_and_override():
    assert config(make_vocab_size_divisible_by=1024).padded_vocab_size == 51200
    assert config(vocab_size=5000, pad_vocab_size_to=5120).padded_vocab_size == 5120


def test_defaults_follow_megatron():
    c = config(seq_length=128)
    assert (c.ffn_size, c.max_positions, c.head_dim) == (256, 128, 16)
    assert c.output_layer_init_std == pytest.approx(0.02 / 2.0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_size": 65}, "hidden_size (65) must be divisible by num_attention_heads (4)"),
        ({"num_layers": 0}, "num_layers must be a positive integer"),
        ({"vocab_size": 5000, "pad_vocab_size_to": 5122}, "5122 is not divisible by 128"),
        ({"vocab_size": 5000, "pad_vocab_size_to": 4096}, "pad_vocab_size_to (4096) is smaller"),
        (
            {"seq_length": 128, "max_position_embeddings": 64},
            "max_position_embeddings (64) must be >=",
        ),
        ({"position_embedding_type": "sinusoidal"}, "position_embedding_type must be one of"),
        ({"attention_backend": "xformers"}, "attention_backend must be one of"),
        ({"activation_checkpointing": "some"}, "activation_checkpointing must be one of"),
        ({"params_dtype": "fp8"}, "params_dtype must be one of"),
        ({"hidden_dropout": 1.0}, "hidden_dropout must be in [0, 1)"),
        ({"ffn_hidden_size": 0}, "ffn_hidden_size must be positive"),
        ({"layernorm_epsilon": 0.0}, "layernorm_epsilon must be > 0"),
        (
            {"position_embedding_type": "rotary", "hidden_size": 12, "num_attention_heads": 4},
            "rotary position embeddings need an even number of rotated dimensions",
        ),
    ],
)
def test_validation_names_the_field(overrides, message):
    with pytest.raises(ValueError) as error:
        config(**overrides)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "tp, overrides, message",
    [
        (3, {}, "num_attention_heads (4) must be divisible by tensor_model_parallel_size (3)"),
        (
            4,
            {"num_query_groups": 2},
            "num_query_groups (2) must be divisible by tensor_model_parallel_size (4)",
        ),
        (
            2,
            {"ffn_hidden_size": 3},
            "ffn_hidden_size (3) must be divisible by tensor_model_parallel_size (2)",
        ),
        (
            2,
            {"vocab_size": 5000, "pad_vocab_size_to": 5121, "make_vocab_size_divisible_by": 1},
            "pad_vocab_size_to: 5121 is not divisible by 2",
        ),
        (
            4,
            {"sequence_parallel": True, "seq_length": 30},
            "sequence_parallel needs seq_length (30) divisible by tensor_model_parallel_size (4)",
        ),
        (1, {"sequence_parallel": True}, "turn it off at tensor_model_parallel_size 1"),
    ],
)
def test_a_tensor_parallel_size_that_does_not_split_the_model_is_named(tp, overrides, message):
    with pytest.raises(ValueError) as error:
        check_tensor_parallel(config(**overrides), tp)
    assert message in str(error.value) and "\n" not in str(error.value)
    if tp > 1:
        with pytest.raises(ValueError, match=re.escape(message)):
            for_tensor_parallel(config(**overrides), tp)


def test_config_is_frozen():
    c = config()
    with pytest.raises(AttributeError):
        c.num_layers = 3


def test_derived_switches():
    # Sequence parallelism splits nothing at TP=1: a run there turns it off, as Megatron does.
    assert not for_tensor_parallel(config(sequence_parallel=True), 1).sequence_parallel
    assert for_tensor_parallel(config(sequence_parallel=True), 2).sequence_parallel
    assert config(position_embedding_type="alibi").explicit_attention_scores
    assert config(attention_backend="softmax").explicit_attention_scores
    assert not config(attention_backend="sdpa").explicit_attention_scores


def test_public_api_names_resolve():
    import mds_model

    for name in mds_model.__all__:
        assert getattr(mds_model, name) is not None, name
    assert mds_model.build_gpt_pipe.__module__ == "mds_model.pipeline"  # loaded on first use
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mds_model.nope  # noqa: B018


def test_every_field_is_marked_and_the_architecture_is_what_a_checkpoint_must_match():
    kinds = {f.name: f.metadata[KIND] for f in dataclasses.fields(GPTConfig)}
    assert set(kinds.values()) == {ARCHITECTURE, TUNABLE, RUN}
    assert GPTConfig.fields_of_kind(RUN) == (
        "seq_length",
        "hidden_dropout",
        "attention_dropout",
        "init_method_std",
        "use_fused_kernels",
        "attention_backend",
        "activation_checkpointing",
        "params_dtype",
        "sequence_parallel",
    )
    assert GPTConfig.fields_of_kind(TUNABLE) == ("layernorm_epsilon", "rotary_base")
    # meta.json's names: the sizes that `None` fields default to, and the padded vocabulary
    assert GPTConfig.architecture_keys() == (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "padded_vocab_size",
        "ffn_size",
        "max_positions",
        "position_embedding_type",
        "rotary_percent",
        "embed_layernorm",
        "activation",
        "normalization",
        "num_query_groups",
        "add_bias_linear",
        "untie_embeddings_and_output_weights",
    )
    # every compared key is a field or a property of the config
    assert all(hasattr(config(), key) for key in GPTConfig.architecture_keys())


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"normalization": "batchnorm"}, "normalization must be one of layernorm, rmsnorm"),
        ({"num_query_groups": 0}, "num_query_groups must be a positive integer"),
        ({"num_query_groups": 3}, "num_query_groups (3) must divide num_attention_heads (4)"),
        ({"rotary_percent": 0.0}, "rotary_percent must be in (0, 1]"),
    ],
)
def test_llama_choices_are_checked_in_one_line(overrides, message):
    with pytest.raises(ValueError) as error:
        config(**overrides)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_swiglu_ffn_default_is_upstream_s_rule():
    """megatron/arguments.py: with --swiglu and no --ffn-hidden-size, int((4h * 2/3) / 64) * 64."""
    llama = GPTConfig.preset(
        "llama", num_layers=2, hidden_size=2048, num_attention_heads=16, vocab_size=9
    )
    assert llama.ffn_size == 5440 and config().ffn_size == 4 * 64
    assert llama.rotary_dim == 128 and config(rotary_percent=0.25).rotary_dim == 4


def test_one_query_group_per_head_is_multi_head_attention():
    assert config(num_query_groups=4) == config()
    assert config().query_groups == 4


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_each_preset_is_a_valid_architecture(name):
    built = GPTConfig.preset(
        name, num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=9
    )
    assert {key: getattr(built, key) for key in ARCHITECTURES[name]} == ARCHITECTURES[name]
    assert set(ARCHITECTURES[name]) <= set(GPTConfig.fields_of_kind(ARCHITECTURE))


def test_presets_name_gpt2_bloom_and_llama():
    assert ARCHITECTURES["gpt2"] == {}
    bloom = GPTConfig.preset(
        "bloom", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=9
    )
    assert (bloom.position_embedding_type, bloom.embed_layernorm) == ("alibi", True)
    llama = GPTConfig.preset(
        "llama", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=9
    )
    assert (llama.normalization, llama.activation, llama.position_embedding_type) == (
        "rmsnorm",
        "swiglu",
        "rotary",
    )
    assert not llama.add_bias_linear and llama.untie_embeddings_and_output_weights
    with pytest.raises(ValueError, match="architecture must be one of gpt2, bloom, llama"):
        GPTConfig.preset(
            "llama2", num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=9
        )


def test_gpt2_values_are_the_defaults_an_older_meta_json_means():
    assert {name: GPT2[name] for name in ("activation", "normalization", "add_bias_linear")} == {
        "activation": "gelu_tanh",
        "normalization": "layernorm",
        "add_bias_linear": True,
    }
    assert (GPT2["num_query_groups"], GPT2["untie_embeddings_and_output_weights"]) == (None, False)
