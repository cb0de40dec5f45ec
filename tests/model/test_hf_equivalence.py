"""Our GPT against independent implementations: Hugging Face's GPT2LMHeadModel (weights exported
with `mds_model.to_hf_gpt2_state_dict`), and rotary and ALiBi against their papers' formulas;
the Llama adapter's cuts against the tests' own Llama mapping (llama_hf.py)."""

import json
import math

import pytest
import safetensors.torch
import torch
import transformers
from mds_model import (
    GPT,
    GPTConfig,
    ParallelGroups,
    from_hf_gpt2_state_dict,
    hf_gpt2_config,
    to_hf_gpt2_state_dict,
)
from mds_model.attention import ParallelSelfAttention, RotaryEmbedding

from .stand_in_group import tensor_parallel_rank

VOCAB, SEQ = 100, 16


def tiny(**overrides) -> GPTConfig:
    base = dict(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=SEQ,
        max_position_embeddings=20,
        ffn_hidden_size=48,  # not 4h: n_inner must carry it
        layernorm_epsilon=1e-5,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
    )
    base.update(overrides)
    return GPTConfig(**base)


def tokens(seed: int, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def trained_looking(model: GPT) -> GPT:
    """LayerNorms at their init (ones, zeros) and zero biases would hide swapped or mis-split
    weights: give every parameter distinct random values."""
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return model


def export(model: GPT, folder) -> transformers.GPT2LMHeadModel:
    """Writes config.json + model.safetensors as the reshaper will, and loads them with HF."""
    (folder / "config.json").write_text(json.dumps(hf_gpt2_config(model.config)))
    state = to_hf_gpt2_state_dict(model.state_dict(), model.config)
    safetensors.torch.save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(
        folder, output_loading_info=True, attn_implementation="eager"
    )
    assert {k: v for k, v in info.items() if v} == {}, info  # no missing/unexpected keys
    return hf.eval()


@pytest.mark.parametrize(("activation", "hf_name"), [("gelu_tanh", "gelu_new"), ("gelu", "gelu")])
@pytest.mark.parametrize("use_fused_kernels", [False, True])
def test_exported_weights_give_hugging_face_gpt2_the_same_logits(
    tmp_path, use_fused_kernels, activation, hf_name
):
    config = tiny(use_fused_kernels=use_fused_kernels, activation=activation)
    model = trained_looking(GPT(config, init_seed=3)).eval()
    hf = export(model, tmp_path)
    assert hf.config.n_inner == 48 and hf.config.vocab_size == VOCAB
    assert hf.config.activation_function == hf_name  # gelu_new: tanh; gelu: torch's exact
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied
    seq = tokens(1)
    with torch.no_grad():
        ours = model.logits(seq)  # (B, S, 128): the padded vocabulary
        theirs = hf(seq).logits
    assert theirs.shape == (2, SEQ, VOCAB)
    # ~2e-6 apart (logits up to ~6); the two GeLUs' logits are 4e-4 apart on these weights.
    torch.testing.assert_close(ours[..., :VOCAB], theirs, rtol=1e-5, atol=2e-5)
    # Their loss (mean next-token cross-entropy) equals ours on the same shifted labels, over the
    # unpadded vocabulary.
    labels = seq.clone()
    with torch.no_grad():
        hf_loss = hf(seq, labels=labels).loss
        our_losses = torch.nn.functional.cross_entropy(
            ours[:, :-1, :VOCAB].flatten(0, 1), seq[:, 1:].flatten()
        )
    torch.testing.assert_close(our_losses, hf_loss, rtol=1e-5, atol=1e-5)
    # The tolerance sees the GeLU: the other one's logits are far outside it.
    hf.config.activation_function = "gelu" if hf_name == "gelu_new" else "gelu_new"
    other = transformers.GPT2LMHeadModel(hf.config).eval()
    other.load_state_dict(hf.state_dict())
    with torch.no_grad():
        assert (other(seq).logits - theirs).abs().max() > 2e-4


def test_hugging_face_weights_load_back_into_ours(tmp_path):
    model = trained_looking(GPT(tiny(), init_seed=4)).eval()
    hf = export(model, tmp_path)
    back = GPT(tiny(), init_seed=0).eval()
    back.load_state_dict(from_hf_gpt2_state_dict(hf.state_dict(), back.config))
    ours = model.state_dict()
    for name, tensor in back.state_dict().items():
        if name == "embedding.word_embeddings.weight":  # padding rows come back as zeros
            assert torch.equal(tensor[:VOCAB], ours[name][:VOCAB])
            assert not tensor[VOCAB:].any()
        else:
            assert torch.equal(tensor, ours[name]), name


def test_export_refuses_what_gpt2_cannot_express():
    with pytest.raises(ValueError, match="^position_embedding_type 'rotary' has no GPT2LMHead"):
        hf_gpt2_config(tiny(position_embedding_type="rotary"))
    with pytest.raises(ValueError, match=r"^embed_layernorm True has no .* \(GPT-2's is False\)$"):
        to_hf_gpt2_state_dict({}, tiny(embed_layernorm=True))
    state = GPT(tiny(), init_seed=0).state_dict()
    del state["layers.1.mlp.dense_4h_to_h.bias"]
    with pytest.raises(ValueError, match="no 'layers.1.mlp.dense_4h_to_h.bias'"):
        to_hf_gpt2_state_dict(state, tiny())
    shard = GPT(tiny(), init_seed=0).state_dict()
    shard["layers.0.self_attention.query_key_value.weight"] = torch.zeros(48, 32)  # a TP=2 half
    with pytest.raises(ValueError, match=r"shape \(48, 32\), expected \(96, 32\)"):
        to_hf_gpt2_state_dict(shard, tiny())


# Rotary: RoFormer (Su et al. 2021) rotates pairs of query/key features by position * theta_i,
# theta_i = base^(-2i/d). GPT-NeoX (and we) pair feature i with feature i + d/2 ("rotate half")
# rather than 2i with 2i+1: the same rotation on permuted features.


def rotate_by_formula(x: torch.Tensor, positions: list[int], base: float) -> torch.Tensor:
    """x (..., S, d) -> each pair (x_i, x_{i+d/2}) at position m rotated by m * base^(-2i/d)."""
    d = x.shape[-1]
    out = x.clone().double()
    for s, m in enumerate(positions):
        for i in range(d // 2):
            angle = m * base ** (-2.0 * i / d)
            a, b = x[..., s, i].double(), x[..., s, i + d // 2].double()
            out[..., s, i] = a * math.cos(angle) - b * math.sin(angle)
            out[..., s, i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out.to(x.dtype)


def test_rotary_embedding_follows_the_roformer_rotation():
    rotary = RotaryEmbedding(8, max_positions=32, base=10000.0)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64).float()
    torch.testing.assert_close(rotary(x, 7), rotate_by_formula(x, list(range(7, 12)), 10000.0))
    # What makes it relative: q_m . k_n depends on m - n only.
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> float:
        return (rotary(q, m) * rotary(k, n)).sum().item()

    assert score(9, 4) == pytest.approx(score(20, 15), abs=1e-5)
    assert score(9, 4) != pytest.approx(score(9, 5), abs=1e-3)


def attention_by_hand(attn: ParallelSelfAttention, x: torch.Tensor, bias_fn) -> torch.Tensor:
    """Causal multi-head attention computed from the module's weights, Megatron's QKV layout
    ([heads, 3, head_dim] rows) and a per-head score transform bias_fn(scores, head)."""
    seq, batch, hidden = x.shape
    heads, d = attn.num_local_heads, attn.head_dim
    w = attn.query_key_value.weight.view(heads, 3, d, hidden)
    b = attn.query_key_value.bias.view(heads, 3, d)
    out = torch.zeros(batch, seq, hidden)
    for head in range(heads):
        q, k, v = (x.transpose(0, 1) @ w[head, j].T + b[head, j] for j in range(3))  # (B, S, d)
        scores = bias_fn(q, k, head)  # (B, S, S)
        causal = torch.ones(seq, seq, dtype=torch.bool).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        context = probs @ v  # (B, S, d)
        out += context @ attn.dense.weight[:, head * d : (head + 1) * d].T
    return (out + attn.dense.bias).transpose(0, 1)


def test_rotary_attention_equals_the_formula_applied_to_q_and_k():
    config = tiny(position_embedding_type="rotary", max_position_embeddings=None)
    attn = ParallelSelfAttention(config, groups=ParallelGroups(), rng_tracker=None).eval()
    trained_looking_attention(attn)
    x = torch.randn(SEQ, 2, 32)
    positions = list(range(SEQ))

    def rotary_scores(q, k, head):
        q, k = (rotate_by_formula(t, positions, config.rotary_base) for t in (q, k))
        return q @ k.transpose(-1, -2) / math.sqrt(config.head_dim)

    with torch.no_grad():
        torch.testing.assert_close(
            attn(x), attention_by_hand(attn, x, rotary_scores), rtol=1e-4, atol=1e-5
        )


def trained_looking_attention(attn: ParallelSelfAttention) -> None:
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


# ALiBi (Press et al. 2022): head i of n (i = 1..n) adds -m_i * (query pos - key pos) to its
# scores, m_i = 2^(-8i/n). For n not a power of two: the 2^floor(log2 n) slopes of that power,
# then every other slope of the next power of two (2^(-8i/2c), i = 1, 3, 5, ...) until n.


def alibi_slopes_by_formula(n: int) -> list[float]:
    closest = 2 ** math.floor(math.log2(n))
    slopes = [2.0 ** (-8.0 * i / closest) for i in range(1, closest + 1)]
    slopes += [2.0 ** (-8.0 * i / (2 * closest)) for i in range(1, 2 * closest, 2)]
    return slopes[:n]


@pytest.mark.parametrize("num_heads", [1, 2, 4, 8, 16, 32, 3, 5, 6, 12, 20, 24, 40])
def test_alibi_slopes_follow_the_paper(num_heads):
    config = tiny(
        hidden_size=8 * num_heads, num_attention_heads=num_heads, position_embedding_type="alibi"
    )
    attn = ParallelSelfAttention(config, groups=ParallelGroups(), rng_tracker=None)
    expected = torch.tensor(alibi_slopes_by_formula(num_heads))
    torch.testing.assert_close(attn.alibi.flatten(), expected, rtol=1e-6, atol=0)


def test_alibi_slopes_are_sliced_per_tensor_parallel_rank():
    config = tiny(num_attention_heads=8, position_embedding_type="alibi")
    # Construction draws no collective; a stand-in group object is enough to see rank 1's slice.
    groups = tensor_parallel_rank(1, 2)
    attn = ParallelSelfAttention(config, groups=groups, rng_tracker=None)
    expected = torch.tensor(alibi_slopes_by_formula(8)[4:])
    torch.testing.assert_close(attn.alibi.flatten(), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("use_fused_kernels", [False, True])
def test_alibi_attention_equals_the_papers_bias_matrix(use_fused_kernels):
    config = tiny(
        num_attention_heads=4,
        position_embedding_type="alibi",
        use_fused_kernels=use_fused_kernels,
    )
    attn = ParallelSelfAttention(config, groups=ParallelGroups(), rng_tracker=None).eval()
    trained_looking_attention(attn)
    x = torch.randn(SEQ, 2, 32)
    slopes = alibi_slopes_by_formula(4)
    distance = torch.arange(SEQ).view(-1, 1) - torch.arange(SEQ).view(1, -1)  # i - j

    def alibi_scores(q, k, head):
        return q @ k.transpose(-1, -2) / math.sqrt(config.head_dim) - slopes[head] * distance

    with torch.no_grad():
        torch.testing.assert_close(
            attn(x), attention_by_hand(attn, x, alibi_scores), rtol=1e-4, atol=1e-5
        )


def _llama_bridge():
    """tests/model/llama_hf.py: the tests' own Llama mapping, written from upstream's layouts
    independently of mds_model.hf_families (the tests import in importlib mode)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).with_name("llama_hf.py")
    spec = importlib.util.spec_from_file_location("llama_hf", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("num_query_groups", [2, 1, None], ids=["gqa", "mqa", "mha"])
def test_the_llama_adapter_cuts_as_the_tests_bridge(num_query_groups):
    """hf_families' Llama names and q/k/v, gate/up cuts equal the bridge's tensor for tensor
    (the bridge keeps the padded vocabulary rows, the adapter the tokenizer's), and back."""
    from mds_model.hf_families import LLAMA, hf_adapter

    config = GPTConfig.preset(
        "llama", num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=VOCAB,
        num_query_groups=num_query_groups, ffn_hidden_size=48,
    )  # fmt: skip
    assert hf_adapter(config) is LLAMA
    state = {
        name: torch.randn(p.shape, generator=torch.Generator().manual_seed(i))
        for i, (name, p) in enumerate(GPT(config, init_seed=0).state_dict().items())
    }
    ours, bridge = LLAMA.to_hf(state, config), _llama_bridge().to_hf_llama(state, config)
    assert set(ours) == set(bridge)
    for name, tensor in ours.items():
        assert torch.equal(tensor, bridge[name][: tensor.shape[0]]), name
    back = LLAMA.from_hf(ours, config)
    for name, tensor in state.items():
        assert torch.equal(back[name][:VOCAB], tensor[:VOCAB]), name
