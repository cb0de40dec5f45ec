"""Our Llama-family GPT against transformers' own models with the same weights: LlamaForCausalLM
(RMSNorm, SwiGLU, grouped-query attention, no linear biases, untied head, rotary theta) for logits
and every gradient, and GPTNeoXForCausalLM for partial rotary (upstream's --rotary-percent, NeoX's
rotary_pct) with LayerNorm, GeLU, biases and its untied head. The mapping is `llama_hf.py`'s,
written from upstream's layouts; TP=2 and PP=2 are held to the same models in test_parallel.py.
Decoding with a KV cache is held to the full forward."""

import importlib.util
from pathlib import Path

import pytest
import torch
import transformers
from mds_model import GPT, GPTConfig
from mds_model.decoding import Decoder, KVCache, StaticKVCache


def _load_bridge():
    """llama_hf.py beside this file (the tests import in importlib mode, without packages)."""
    spec = importlib.util.spec_from_file_location(
        "llama_hf", Path(__file__).with_name("llama_hf.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bridge = _load_bridge()
from_hf_llama, hf_gradients, hf_llama = bridge.from_hf_llama, bridge.hf_gradients, bridge.hf_llama

VOCAB, SEQ = 120, 16
TOL = 1e-5


def llama(**overrides) -> GPTConfig:
    base = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=8,
        num_query_groups=2,
        vocab_size=VOCAB,
        seq_length=SEQ,
        ffn_hidden_size=96,
        rotary_base=500000.0,
        layernorm_epsilon=1e-5,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
    )
    return GPTConfig.preset("llama", **{**base, **overrides})


def tokens(seed: int, batch: int = 2, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def trained_looking(model: GPT) -> GPT:
    """Norm weights at one would hide swapped or mis-split weights: distinct values for all."""
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return model


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_query_groups": None},  # one key/value head per query head
        {"num_query_groups": 1},  # multi-query attention
        {"use_fused_kernels": True},  # Triton's RMSNorm and SwiGLU (the interpreter on CPU)
    ],
    ids=["gqa", "mha", "mqa", "fused"],
)
def test_llama_equals_transformers_logits_and_every_gradient(overrides):
    config = llama(**overrides)
    ours = trained_looking(GPT(config, init_seed=3))
    theirs = hf_llama(ours.state_dict(), config)
    seq = tokens(1)
    labels = tokens(2)
    ours_logits = ours.logits(seq)
    theirs_logits = theirs(seq).logits
    assert (ours_logits - theirs_logits).abs().max().item() < TOL
    ours(seq, labels).mean().backward()
    loss = torch.nn.functional.cross_entropy(
        theirs_logits.reshape(-1, theirs_logits.shape[-1]), labels.reshape(-1)
    )
    loss.backward()
    expected = from_hf_llama(hf_gradients(theirs), config)
    for name, p in ours.named_parameters():
        assert (p.grad - expected[name]).abs().max().item() < TOL, name


def gpt_neox(ours: GPT, config: GPTConfig) -> transformers.GPTNeoXForCausalLM:
    """GPTNeoXForCausalLM with our weights: its names are Megatron's inside a layer, and its
    query_key_value rows are per head [heads, 3, head_dim] as ours."""
    hf = transformers.GPTNeoXForCausalLM(
        transformers.GPTNeoXConfig(
            vocab_size=config.padded_vocab_size,
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_attention_heads,
            intermediate_size=config.ffn_size,
            hidden_act="gelu",
            rope_parameters={
                "rope_type": "default",
                "rope_theta": config.rotary_base,
                "partial_rotary_factor": config.rotary_percent,
            },
            max_position_embeddings=config.max_positions,
            layer_norm_eps=config.layernorm_epsilon,
            use_parallel_residual=False,
            tie_word_embeddings=False,
            attention_dropout=0.0,
            hidden_dropout=0.0,
            attn_implementation="eager",
        )
    ).float()
    state = {}
    for name, tensor in ours.state_dict().items():
        name = name.replace("self_attention.", "attention.")
        name = name.replace("embedding.word_embeddings.", "embed_in.")
        name = name.replace("final_layernorm.", "final_layer_norm.")
        state[name if name.startswith("output_layer") else "gpt_neox." + name] = tensor
    state["lm_head.weight"] = state.pop("output_layer.weight")
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not [k for k in missing if "rotary" not in k and "masked_bias" not in k], missing
    assert not unexpected, unexpected
    return hf.eval()


def test_partial_rotary_equals_gpt_neox():
    config = GPTConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=SEQ,
        position_embedding_type="rotary",
        rotary_percent=0.5,  # 8 of each head's 16 dimensions rotate
        rotary_base=20000.0,
        activation="gelu",
        untie_embeddings_and_output_weights=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
    )
    ours = trained_looking(GPT(config, init_seed=4)).eval()
    theirs = gpt_neox(ours, config)
    assert theirs.config.rope_parameters["partial_rotary_factor"] == 0.5
    seq = tokens(5)
    with torch.no_grad():
        difference = (ours.logits(seq) - theirs(seq).logits).abs().max().item()
    assert difference < TOL
    # and the rotation is partial: rotating the whole head is another function
    whole = GPT(GPTConfig(**{**config.__dict__, "rotary_percent": 1.0}), init_seed=4)
    whole.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (whole.eval().logits(seq) - ours.logits(seq)).abs().max().item() > 1e-3


@pytest.mark.parametrize("num_query_groups", [2, None])
def test_llama_decoding_with_caches_equals_the_full_forward(num_query_groups):
    config = llama(num_query_groups=num_query_groups)
    model = trained_looking(GPT(config, init_seed=6)).eval()
    decoder = Decoder(model)
    seq = tokens(7)
    with torch.no_grad():
        full = model.logits(seq)
        cache = KVCache(config.num_layers)
        steps = [decoder.decode(seq[:, :10], cache=cache)]
        steps += [decoder.decode(seq[:, i : i + 1], cache=cache) for i in range(10, SEQ)]
        # float32 sums in another order: a few ulps of logits near 3
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=5e-5)
        static = StaticKVCache(config, batch_size=2, max_length=SEQ)
        positions = torch.arange(SEQ).expand(2, SEQ)
        hidden = decoder.decode_static_hidden(seq, positions=positions, cache=static)
        torch.testing.assert_close(decoder.lm_head(hidden), full, rtol=1e-5, atol=5e-5)
