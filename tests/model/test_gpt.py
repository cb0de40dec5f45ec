"""Single-process GPT behaviour: causality, KV cache, backends, checkpointing, names, init."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from mds_model import (
    GPT,
    Decoder,
    GPTConfig,
    KVCache,
    ParallelGroups,
    StaticKVCache,
    masked_mean,
)
from mds_model.rng import MODEL_PARALLEL_RNG, RNGStatesTracker, model_parallel_seed

from .stand_in_group import tensor_parallel_rank

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
        before = model.logits(base)
        for t in (0, 5, SEQ - 1):
            changed = base.clone()
            changed[:, t] = (changed[:, t] + 1) % VOCAB
            after = model.logits(changed)
            assert torch.equal(after[:, :t], before[:, :t]), f"position < {t} changed"
            assert not torch.allclose(after[:, t], before[:, t]), f"position {t} did not change"


@pytest.mark.parametrize("position", ["learned", "rotary", "alibi"])
def test_kv_cache_generation_matches_full_forward(position):
    model = GPT(tiny(position_embedding_type=position), init_seed=2).eval()
    seq = tokens(3)
    cache, decoder = KVCache(model.config.num_layers), Decoder(model)
    with torch.no_grad():
        full = model.logits(seq)
        pieces = [decoder.decode(seq[:, :9], cache=cache)]  # the prompt
        assert cache.num_positions == 9
        for t in range(9, SEQ):  # one token at a time, as a sampler would
            pieces.append(decoder.decode(seq[:, t : t + 1], cache=cache))
    assert cache.num_positions == SEQ
    assert cache.layers[0].keys.shape == cache.layers[1].values.shape == (2, 4, SEQ, 8)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


def _large_weights(model: GPT) -> GPT:
    """Weights of std 0.3, so the MLP's inputs reach |z| ~ 1-3 where the two GeLUs differ."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


@pytest.mark.parametrize(("activation", "approximate"), [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_the_mlp_computes_the_configured_gelu_in_every_path(activation, approximate):
    """The MLP against torch's F.gelu on its own weights; full forward, the KV cache and the
    static cache (decoding's bias+GeLU path) give one model's logits, another GeLU's are apart."""
    model = _large_weights(GPT(tiny(activation=activation), init_seed=5)).eval()
    mlp = model.layers[0].mlp
    x = torch.randn(SEQ, 2, 32, generator=torch.Generator().manual_seed(3))
    up, down = mlp.dense_h_to_4h, mlp.dense_4h_to_h
    by_hand = F.linear(F.gelu(F.linear(x, up.weight, up.bias), approximate=approximate),
                       down.weight, down.bias)  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), by_hand, rtol=1e-5, atol=1e-5)
        seq = tokens(4)
        full = model.logits(seq)
        cache, decoder = KVCache(model.config.num_layers), Decoder(model)
        pieces = [decoder.decode(seq[:, :5], cache=cache)]
        pieces += [decoder.decode(seq[:, t : t + 1], cache=cache) for t in range(5, SEQ)]
        torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)
        static = StaticKVCache(model.config, batch_size=2, max_length=SEQ)
        positions = torch.arange(SEQ).expand(2, SEQ)
        got = decoder.lm_head(decoder.decode_static_hidden(seq, positions=positions, cache=static))
        torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
        other = "gelu_tanh" if activation == "gelu" else "gelu"
        twin = GPT(tiny(activation=other), init_seed=0).eval()
        twin.load_state_dict(model.state_dict())
        assert (twin.logits(seq) - full).abs().max() > 1e-3


def test_sdpa_and_explicit_softmax_backends_agree():
    seq = tokens(4)
    sdpa = GPT(tiny(attention_backend="sdpa"), init_seed=5)
    softmax = GPT(tiny(attention_backend="softmax"), init_seed=5)
    torch.testing.assert_close(sdpa.logits(seq), softmax.logits(seq), rtol=1e-5, atol=1e-5)


def test_cudnn_backend_is_plain_sdpa_off_cuda():
    """`cudnn` puts cuDNN first in SDPA's order on CUDA only; elsewhere it is SDPA as it is."""
    seq = tokens(4)
    sdpa = GPT(tiny(attention_backend="sdpa"), init_seed=5)
    cudnn = GPT(tiny(attention_backend="cudnn"), init_seed=5)
    assert torch.equal(cudnn.logits(seq), sdpa.logits(seq))


def test_positions_beyond_max_position_embeddings_are_an_error():
    decoder = Decoder(GPT(tiny(), init_seed=0).eval())
    cache = KVCache(2)
    decoder.decode(tokens()[:, : SEQ - 2], cache=cache)
    with pytest.raises(ValueError, match="exceed max_position_embeddings"):
        decoder.decode(tokens()[:, :4], cache=cache)
    with pytest.raises(ValueError, match="the cache has 3 layers, the model 2"):
        decoder.decode(tokens()[:, :1], cache=KVCache(3))


def test_decoding_needs_sequence_parallelism_off():
    model = GPT(tiny(), init_seed=0)
    model.layers[0].sequence_parallel = True  # as a TP=2 model with sequence_parallel=True has
    with pytest.raises(ValueError, match="decoding needs a config with sequence_parallel=False"):
        Decoder(model)


def test_every_forward_returns_one_tensor():
    # One kind of result per method: no tuple that appears with a flag.
    model = GPT(tiny(embed_layernorm=True), init_seed=0)
    seq, labels = tokens(), tokens(1)
    assert model(seq, labels).shape == (2, SEQ)
    assert model.logits(seq).shape == (2, SEQ, 128)
    hidden = torch.randn(SEQ, 2, 32)
    layer = model.layers[0]
    for module in (
        layer,
        layer.input_layernorm,
        layer.self_attention,
        layer.mlp,
        layer.self_attention.query_key_value,
        layer.self_attention.dense,
        model.final_layernorm,
    ):
        assert isinstance(module(hidden), torch.Tensor), type(module).__name__
    assert isinstance(model.embedding(seq), torch.Tensor)
    normed, summed = layer.post_attention_layernorm.add_norm(hidden, hidden)
    torch.testing.assert_close(summed, 2 * hidden)
    torch.testing.assert_close(normed, layer.post_attention_layernorm(2 * hidden))


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
    assert not torch.equal(model.logits(seq), model.logits(seq))
    model.eval()
    assert torch.equal(model.logits(seq), model.logits(seq))


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


def test_megatron_deepspeed_padding_and_tied_head():
    """Names and shapes of every parameter: tests/model/test_parameters.py (the table)."""
    shapes = {n: tuple(p.shape) for n, p in GPT(tiny(), init_seed=0).named_parameters()}
    assert shapes["embedding.word_embeddings.weight"] == (128, 32)  # 100 padded to 128
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


def test_a_tensor_parallel_group_that_does_not_split_the_heads_is_refused():
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) must be divisible by "):
        GPT(tiny(), groups=tensor_parallel_rank(0, 3))


def test_loss_is_masked_mean_of_per_token_cross_entropy():
    model = GPT(tiny(), init_seed=0)
    seq, labels = tokens(1), tokens(2)
    mask = (torch.arange(SEQ) % 3 != 0).float().expand(2, SEQ)
    losses = model(seq, labels)
    expected = torch.nn.functional.cross_entropy(
        model.logits(seq).flatten(0, 1), labels.flatten(), reduction="none"
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
        model.logits(bad)
    model.logits(tokens())  # in-range ids still work


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"position_embedding_type": "alibi", "embed_layernorm": True},
        {"activation": "gelu"},
    ],
    ids=["learned", "alibi_softmax_kernel", "exact_gelu"],
)
def test_default_fused_kernels_equal_the_pure_torch_path(overrides):
    # The default configuration (Triton kernels, dropout 0.1) through the CPU interpreter against
    # the pure-torch references: same dropout masks (same seeds), so loss and every gradient agree
    # to fp32 rounding. ALiBi adds the softmax kernel to LayerNorm, bias+GeLU and cross-entropy.
    config = GPTConfig(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=SEQ,
        **overrides,
    )
    assert config.use_fused_kernels and config.hidden_dropout > 0
    results = []
    for fused in (True, False):
        tracker = model_parallel_seed(5)
        model = GPT(replace(config, use_fused_kernels=fused), rng_tracker=tracker, init_seed=8)
        mask = (torch.arange(SEQ) % 4 != 0).float().expand(2, SEQ)
        loss = masked_mean(model.train()(tokens(1), tokens(2)), mask)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss, grads), (ref_loss, ref_grads) = results
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        ref = ref_grads[name]
        assert ((grad - ref).norm() / ref.norm()).item() < 1e-5, name


def test_fp32_weights_under_bf16_autocast_with_and_without_kernels():
    # The reference's precision scheme (benchmarks/model_step.py's *-fp32-autocast variant): the
    # fp32 residual stream meets bf16 matmul outputs at the fused add+LayerNorm.
    seq, labels = tokens(1), tokens(2)
    fp32_loss = masked_mean(GPT(tiny(), init_seed=1)(seq, labels), None)
    losses = []
    for fused in (True, False):
        model = GPT(tiny(use_fused_kernels=fused), init_seed=1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = masked_mean(model(seq, labels), None)
        loss.backward()
        assert model.layers[0].mlp.dense_h_to_4h.weight.grad.dtype == torch.float32
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)
    assert losses[0] == pytest.approx(fp32_loss.item(), rel=1e-2)
