"""The static-cache step (`Decoder.decode_static_hidden`) on every block the model builds: Llama's
(RMSNorm, SwiGLU, rotary, grouped-query, multi-query or multi-head attention, tied or untied head),
GPT-NeoX's partial rotary, and grouped keys and values with learned or ALiBi positions give each
ragged row's full-forward logits, on the pure-torch references (fp32, tight) and on the kernels
(Triton's interpreter here: the rotary split into the cache, the RMSNorm and SwiGLU kernels); the
one-row skinny path (add + RMSNorm + product, SwiGLU epilogue, the LM head) is run through the
interpreter in bf16 and follows the full forward within bf16's rounding; `attend_one_token` (a
step's rotary, cache write and attention in one kernel) against its reference."""

import pytest
import torch
from mds_model import GPT, Decoder, GPTConfig, StaticKVCache
from mds_model import kernels as mds_kernels
from mds_model.decoding import projections
from mds_model.kernels.rotary import attend_one_token

VOCAB, SEQ = 120, 12

BLOCKS = {
    "llama-gqa": ("llama", {"num_query_groups": 2}),
    "llama-mha": ("llama", {}),
    "llama-mqa": ("llama", {"num_query_groups": 1}),
    "llama-tied": ("llama", {"num_query_groups": 2, "untie_embeddings_and_output_weights": False}),
    "llama-softmax": ("llama", {"num_query_groups": 2, "attention_backend": "softmax"}),
    "neox-partial-rotary": ("gpt_neox", {}),
    "gpt2-gqa": ("gpt2", {"num_query_groups": 2}),
    "alibi-gqa": ("bloom", {"num_query_groups": 2}),
}


def block(name: str, **overrides) -> GPTConfig:
    preset, fields = BLOCKS[name]
    base = dict(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        vocab_size=VOCAB,
        seq_length=SEQ,
        ffn_hidden_size=96,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
    )
    return GPTConfig.preset(preset, **{**base, **fields, **overrides})


def trained_looking(model: GPT) -> GPT:
    """Norm weights at one and zero biases would hide a swapped or skipped weight."""
    gen = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen) * 0.2
            p.copy_((noise + (1.0 if p.dim() == 1 else 0.0)).to(p.dtype))
    return model


def decode_ragged(decoder: Decoder, sequences, prompt_lengths, cache, *, device="cpu"):
    """Prefill right-padded prompts, then one token per row per step; each row's logits at every
    position it fed (B rows of (len, V))."""
    batch, width = len(sequences), max(prompt_lengths)
    padded = torch.zeros(batch, width, dtype=torch.long)
    for b, (seq, n) in enumerate(zip(sequences, prompt_lengths, strict=True)):
        padded[b, :n] = seq[:n]
    positions = torch.arange(width).expand(batch, width)
    hidden = decoder.decode_static_hidden(
        padded.to(device), positions=positions.to(device), cache=cache
    )
    first = decoder.lm_head(hidden)
    out = [[first[b, t] for t in range(n)] for b, n in enumerate(prompt_lengths)]
    position = torch.tensor(prompt_lengths)
    last = torch.tensor([len(s) - 1 for s in sequences])
    for _ in range(max(len(s) - n for s, n in zip(sequences, prompt_lengths, strict=True))):
        index = torch.minimum(position, last)
        token = torch.stack([s[i] for s, i in zip(sequences, index.tolist(), strict=True)])
        hidden = decoder.decode_static_hidden(
            token[:, None].to(device), positions=index[:, None].to(device), cache=cache
        )
        logits = decoder.lm_head(hidden)
        for b, seq in enumerate(sequences):
            if position[b] < len(seq):
                out[b].append(logits[b, 0])
        position += 1
    return [torch.stack(o) for o in out]


def rows(lengths: list[int], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("use_kernel", [False, True], ids=["references", "kernels"])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_static_cache_rows_match_their_full_forward(name, use_kernel):
    # the kernels on the GPU where there is one (else Triton's interpreter)
    device = "cuda" if use_kernel and torch.cuda.is_available() else "cpu"
    model = trained_looking(GPT(block(name, use_fused_kernels=use_kernel), init_seed=3)).eval()
    model = model.to(device)
    sequences = rows([10, 12, 6], seed=1)
    cache = StaticKVCache(model.config, batch_size=3, max_length=SEQ, device=device)
    # fp32 sums in another order (grouped queries as rows of one head): a few ulps; a GPU's
    # products and attention kernels sum in their own orders
    tol = dict(rtol=1e-5, atol=5e-5) if device == "cpu" else dict(rtol=1e-4, atol=2e-4)
    with torch.no_grad():
        got = decode_ragged(Decoder(model), sequences, [3, 8, 5], cache, device=device)
        for seq, logits in zip(sequences, got, strict=True):
            torch.testing.assert_close(logits, model.logits(seq[None].to(device))[0], **tol)


def _one_row_on_the_interpreter(tp_size: int, x: torch.Tensor) -> bool:
    """projections._one_row_kernel without its CUDA check: CPU tensors through the interpreter."""
    return tp_size == 1 and x.dtype == torch.bfloat16 and x.numel() == x.shape[-1]


@pytest.mark.parametrize("name", ["llama-gqa", "llama-mqa", "llama-tied", "neox-partial-rotary"])
def test_one_row_skinny_kernels_follow_the_full_forward_bf16(name, monkeypatch):
    """Batch 1 in bf16 takes the skinny kernels (the CUDA path; here interpreted): the fused
    add + norm + QKV product, the SwiGLU (or GeLU) epilogue, the rotary split into the cache;
    the logits follow the model's full forward within bf16's rounding, and the kernels ran (on
    the GPU where there is one)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        monkeypatch.setattr(projections, "_one_row_kernel", _one_row_on_the_interpreter)
    calls = {"skinny_linear": 0, "skinny_add_norm_linear": 0}
    for kernel in calls:
        original = getattr(mds_kernels, kernel)

        def counted(*args, _original=original, _name=kernel, **kwargs):
            calls[_name] += kwargs["use_kernel"]
            return _original(*args, **kwargs)

        monkeypatch.setattr(mds_kernels, kernel, counted)
    config = block(name, use_fused_kernels=True, params_dtype="bfloat16")
    model = trained_looking(GPT(config, init_seed=4)).eval().to(device)
    (sequence,) = rows([SEQ], seed=2)
    cache = StaticKVCache(config, batch_size=1, max_length=SEQ, device=device)
    with torch.no_grad():
        (got,) = decode_ragged(Decoder(model), [sequence], [4], cache, device=device)
        want = model.logits(sequence[None].to(device))[0]
    # every step after the prompt: 2 layers x (QKV and dense_h_to_4h fused, dense, dense_4h_to_h)
    # less the first layer's fused QKV (its input norm is the embedding's alone), and the head
    steps = SEQ - 4
    assert calls == {"skinny_linear": steps * 6, "skinny_add_norm_linear": steps * 3}
    difference = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert difference < 2e-2, difference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("groups", "per_group", "head_dim", "rotary_dim"),
    [(2, 4, 16, 16), (3, 1, 24, 8), (1, 5, 16, 0)],
    ids=["gqa-rotary", "mha-partial-rotary", "mqa-learned"],
)
def test_attend_one_token_matches_its_reference(groups, per_group, head_dim, rotary_dim, dtype):
    """The kernel (here interpreted) against the reference: the keys and values it writes into
    the cache, and the context, at positions 0, past one block of slots (64) and in between."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(groups * 100 + per_group * 10 + rotary_dim)
    batch, slots = 3, 150
    qkv = torch.randn(1, batch, groups * (per_group + 2) * head_dim, generator=gen)
    positions = torch.tensor([[0], [100], [37]])
    tables = (None, None)
    if rotary_dim:
        angles = torch.randn(slots, rotary_dim, generator=gen)
        tables = (angles.cos().to(device), angles.sin().to(device))
    cache = torch.randn(2, batch, groups, slots, head_dim, generator=gen)
    results = []
    for use_kernel in (True, False):
        keys, values = (c.clone().to(device, dtype) for c in cache)
        context = attend_one_token(
            qkv.to(device, dtype), *tables, positions.to(device), keys, values,
            groups=groups, per_group=per_group, head_dim=head_dim, use_kernel=use_kernel,
        )  # fmt: skip
        results.append((context.float().cpu(), keys.float().cpu(), values.float().cpu()))
    (got, got_keys, got_values), (want, keys, values) = results
    assert got.shape == (1, batch, groups * per_group * head_dim)
    # the reference rotates in the cache's dtype, the kernel in fp32 rounded once
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got_keys, keys, **tol)
    assert torch.equal(got_values, values)
    torch.testing.assert_close(got, want, **tol)
