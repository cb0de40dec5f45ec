"""Single-process GPT behaviour: causality, KV cache, backends, checkpointing, names, init."""

import pytest
import torch
from mds_model.config import GPTConfig
from mds_model.gpt import GPT, masked_mean
from mds_model.parallel import ParallelGroups
from mds_model.rng import MODEL_PARALLEL_RNG, RNGStatesTracker, model_parallel_seed

VOCAB, SEQ = 100, 16


def tiny(**overrides) -> GPTConfig:
    base = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=SEQ,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
    )
    base.update(overrides)
    return GPTConfig(**base)


def tokens(seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"position_embedding_type": "rotary"},
        {"position_embedding_type": "alibi", "embed_layernorm": True},
        {"attention_backend": "softmax"},
    ],
)
def test_changing_token_t_never_changes_outputs_before_t(overrides):
    model = GPT(tiny(**overrides), init_seed=1).eval()
    base = tokens()
    with torch.no_grad():
        before = model(base)
        for t in (0, 5, SEQ - 1):
            changed = base.clone()
            changed[:, t] = (changed[:, t] + 1) % VOCAB
            after = model(changed)
            assert torch.equal(after[:, :t], before[:, :t]), f"position < {t} changed"
            assert not torch.allclose(after[:, t], before[:, t]), f"position {t} did not change"


@pytest.mark.parametrize("position", ["learned", "rotary", "alibi"])
def test_kv_cache_generation_matches_full_forward(position):
    model = GPT(tiny(position_embedding_type=position), init_seed=2).eval()
    seq = tokens(3)
    with torch.no_grad():
        full = model(seq)
        logits, cache = model(seq[:, :9], use_cache=True)
        pieces = [logits]
        for t in range(9, SEQ):  # one token at a time, as a sampler would
            logits, cache = model(
                seq[:, t : t + 1], position_offset=t, past_kvs=cache, use_cache=True
            )
            pieces.append(logits)
    assert cache[0][0].shape == (2, 4, SEQ, 8)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


def test_sdpa_and_explicit_softmax_backends_agree():
    seq = tokens(4)
    sdpa = GPT(tiny(attention_backend="sdpa"), init_seed=5)
    softmax = GPT(tiny(attention_backend="softmax"), init_seed=5)
    torch.testing.assert_close(sdpa(seq), softmax(seq), rtol=1e-5, atol=1e-5)


def test_positions_beyond_max_position_embeddings_are_an_error():
    model = GPT(tiny(), init_seed=0)
    with pytest.raises(ValueError, match="exceed max_position_embeddings"):
        model(tokens()[:, :4], position_offset=SEQ - 2)


def _loss_and_grads(checkpointing: str):
    config = tiny(hidden_dropout=0.1, attention_dropout=0.2, activation_checkpointing=checkpointing)
    tracker = model_parallel_seed(123)
    model = GPT(config, rng_tracker=tracker, init_seed=9).train()
    loss = masked_mean(model(tokens(6), tokens(7)), None)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", ["full", "selective"])
def test_activation_checkpointing_replays_dropout_exactly(checkpointing):
    # Recomputation must redraw the same dropout masks, the tracked TP state included.
    loss, grads = _loss_and_grads("none")
    ckpt_loss, ckpt_grads = _loss_and_grads(checkpointing)
    assert torch.equal(loss, ckpt_loss)
    for name, grad in grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_dropout_active_in_train_and_off_in_eval():
    model = GPT(
        tiny(hidden_dropout=0.1, attention_dropout=0.1),
        rng_tracker=model_parallel_seed(0),
        init_seed=0,
    )
    seq = tokens()
    assert not torch.equal(model(seq), model(seq))
    model.eval()
    assert torch.equal(model(seq), model(seq))


def test_rng_tracker_forks_per_tp_rank_and_leaves_default_state_alone():
    draws = []
    for tp_rank in (0, 1):
        tracker = model_parallel_seed(42, tp_rank=tp_rank)
        with tracker.fork():
            inside = torch.rand(4)
        outside = torch.rand(4)
        draws.append((inside, outside))
    assert not torch.equal(draws[0][0], draws[1][0])  # TP-split regions differ per rank
    assert torch.equal(draws[0][1], draws[1][1])  # replicated regions match
    tracker = model_parallel_seed(42)
    with tracker.fork():
        first = torch.rand(3)
    with tracker.fork():
        second = torch.rand(3)
    assert not torch.equal(first, second)  # the tracked state advances
    fresh = RNGStatesTracker()
    with pytest.raises(ValueError, match="never added"):
        with fresh.fork(MODEL_PARALLEL_RNG):
            pass


def test_megatron_deepspeed_parameter_names_and_shapes():
    model = GPT(tiny(), init_seed=0)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes["embedding.word_embeddings.weight"] == (128, 32)  # 100 padded to 128
    assert shapes["embedding.position_embeddings.weight"] == (SEQ, 32)
    layer = {n.split(".", 2)[2]: s for n, s in shapes.items() if n.startswith("layers.1.")}
    assert layer == {
        "input_layernorm.weight": (32,),
        "input_layernorm.bias": (32,),
        "self_attention.query_key_value.weight": (96, 32),
        "self_attention.query_key_value.bias": (96,),
        "self_attention.dense.weight": (32, 32),
        "self_attention.dense.bias": (32,),
        "post_attention_layernorm.weight": (32,),
        "post_attention_layernorm.bias": (32,),
        "mlp.dense_h_to_4h.weight": (128, 32),
        "mlp.dense_h_to_4h.bias": (128,),
        "mlp.dense_4h_to_h.weight": (32, 128),
        "mlp.dense_4h_to_h.bias": (32,),
    }
    assert shapes["final_layernorm.weight"] == (32,)
    assert "lm_head.weight" not in shapes  # the head is tied to the word embeddings


def test_init_is_reproducible_and_seeded_per_layer():
    a, b, c = GPT(tiny(), init_seed=3), GPT(tiny(), init_seed=3), GPT(tiny(), init_seed=4)
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if name.endswith("query_key_value.weight"):
            assert not torch.equal(pa, pc)
    qkv = [layer.self_attention.query_key_value.weight for layer in a.layers]
    assert not torch.equal(qkv[0], qkv[1])
    std = a.layers[0].mlp.dense_4h_to_h.weight.std().item()
    assert std == pytest.approx(0.02 / 2.0, rel=0.1)  # Megatron's scaled output-layer init


def test_groups_must_match_the_config_tp_size():
    with pytest.raises(ValueError, match="tensor_model_parallel_size is 2 in the config"):
        GPT(tiny(tensor_model_parallel_size=2), groups=ParallelGroups())


def test_loss_is_masked_mean_of_per_token_cross_entropy():
    model = GPT(tiny(), init_seed=0)
    seq, labels = tokens(1), tokens(2)
    mask = (torch.arange(SEQ) % 3 != 0).float().expand(2, SEQ)
    losses = model(seq, labels)
    expected = torch.nn.functional.cross_entropy(
        model(seq).flatten(0, 1), labels.flatten(), reduction="none"
    )
    torch.testing.assert_close(losses.flatten(), expected)
    torch.testing.assert_close(
        masked_mean(losses, mask), (expected * mask.flatten()).sum() / mask.sum()
    )


def test_token_ids_past_the_vocabulary_are_an_error():
    model = GPT(tiny(), groups=ParallelGroups())
    padded = model.config.padded_vocab_size
    bad = tokens()
    bad[0, 3] = padded
    with pytest.raises(ValueError, match=f"outside the embedding's {padded} rows"):
        model(bad)
    model(tokens())  # in-range ids still work
