"""mds_model's parameter table (parameters.py) against the module it describes, for every
architecture preset: the table's names and whole shapes are `GPT(config).named_parameters()`'s at
TP=1, and each split kind cuts the TP=1 weights into exactly the shards a TP=2 or TP=4 model
holds (each rank built with Megatron's master-weight init, which slices one seeded master), and
joins them back exactly. The decay groups and the optimizer order derive from the same rows."""

import numpy as np
import pytest
import torch
from mds_checkpoint.engine_names import optimizer_order
from mds_checkpoint.partition import merge_shards, shard_for_rank
from mds_model import GPT, GPTConfig, check_tensor_parallel, for_tensor_parallel
from mds_model.config import ARCHITECTURES
from mds_model.parameters import REPLICATED, parameters

from .stand_in_group import tensor_parallel_rank

# Every preset of today's architectures: GPT-2 (learned positions), BLOOM (ALiBi with the
# embedding LayerNorm), rotary positions, Llama (RMSNorm, SwiGLU's gated split, grouped-query
# attention with 2 key/value groups: whole groups per rank at TP = 2, untied output layer, no
# linear biases); 512 tokens pad to 512 rows at TP = 1, 2 and 4.
PRESETS = {
    "gpt2": {},
    "bloom": {"position_embedding_type": "alibi", "embed_layernorm": True},
    "rotary": {"position_embedding_type": "rotary"},
    "llama": {**ARCHITECTURES["llama"], "num_query_groups": 2},
}


def config(preset: str, **overrides) -> GPTConfig:
    return GPTConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=512,
        seq_length=16,
        ffn_hidden_size=48,
        use_fused_kernels=False,
        **PRESETS[preset],
        **overrides,
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_the_table_is_the_module(preset):
    cfg = config(preset)
    module = [(name, tuple(p.shape)) for name, p in GPT(cfg).named_parameters()]
    assert module == [(param.name, param.shape) for param in parameters(cfg)]
    for param, (_, weight) in zip(parameters(cfg), GPT(cfg).named_parameters(), strict=True):
        assert param.decay == (weight.dim() == 2), param.name  # Megatron's rule, for GPT-2


def _valid(preset: str, tp: int) -> bool:
    try:
        check_tensor_parallel(config(preset), tp)
    except ValueError:  # 2 key/value groups cannot be cut in 4
        return False
    return True


@pytest.mark.parametrize("preset, tp", [(p, tp) for p in PRESETS for tp in (2, 4) if _valid(p, tp)])
def test_each_split_kind_cuts_and_joins_real_shards_exactly(preset, tp):
    whole = {n: p.detach().numpy() for n, p in GPT(config(preset), init_seed=5).named_parameters()}
    ranks = []
    for rank in range(tp):
        groups = tensor_parallel_rank(rank, tp)
        model = GPT(for_tensor_parallel(config(preset), tp), groups=groups, init_seed=5)
        ranks.append({n: p.detach().numpy() for n, p in model.named_parameters()})
    for param in parameters(config(preset)):
        shards = [held[param.name] for held in ranks]
        for rank, shard in enumerate(shards):
            assert shard.shape == param.local_shape(tp), param.name
            cut = shard_for_rank(
                param.name,
                whole[param.name],
                config=config(preset),
                tp_rank=rank,
                tensor_model_parallel_size=tp,
                padded_vocab_size=512,
            )
            np.testing.assert_array_equal(cut, shard, err_msg=param.name)
        joined = merge_shards(param.name, shards, config=config(preset), where="test")
        expected = whole[param.name] if param.split.kind != REPLICATED else shards[0]
        np.testing.assert_array_equal(joined, expected, err_msg=param.name)


def test_decay_groups_and_optimizer_order_come_from_one_table():
    """mds-train's groups (model_setup.parameter_groups) and mds-merge-mp's reading of a saved
    optimizer (engine_names.optimizer_order) both take the table's `decay`: the same order."""
    from mds_train.model_setup import TrainingGPT, parameter_groups

    cfg = config("bloom")
    module = TrainingGPT(cfg)
    names = {id(p): n for n, p in module.gpt.named_parameters()}
    groups = parameter_groups(module, 0.1, config=cfg)
    trained = [names[id(p)] for group in groups for p in group["params"]]
    assert trained == optimizer_order(cfg)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    decayed = {names[id(p)] for p in groups[0]["params"]}
    assert "embedding.word_embeddings.norm.weight" not in decayed
    assert "layers.1.mlp.dense_h_to_4h.weight" in decayed


def test_a_parameter_the_table_does_not_know_is_an_error():
    from mds_train.model_setup import parameter_groups

    cfg = config("gpt2")
    model = GPT(cfg)
    model.layers[0].mlp.register_parameter("gate", torch.nn.Parameter(torch.zeros(4, 4)))
    with pytest.raises(RuntimeError, match=r"layers\.0\.mlp\.gate .* not in mds_model's"):
        parameter_groups(model, 0.1, config=cfg)


def test_the_untied_head_has_its_place_in_the_optimizer_order():
    """Llama: the untied output layer is decayed (a 2-D weight) and last among the decayed, as
    mds-train's groups hold it; no norm bias or linear bias anywhere."""
    from mds_train.model_setup import TrainingGPT, parameter_groups

    cfg = config("llama")
    module = TrainingGPT(cfg)
    names = {id(p): n for n, p in module.gpt.named_parameters()}
    groups = parameter_groups(module, 0.1, config=cfg)
    trained = [names[id(p)] for group in groups for p in group["params"]]
    assert trained == optimizer_order(cfg)
    decayed = [names[id(p)] for p in groups[0]["params"]]
    assert decayed[-1] == "output_layer.weight" and not any("bias" in n for n in trained)
