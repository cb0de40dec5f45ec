"""`GPT.decode_static` over a preallocated `StaticKVCache`: ragged rows with per-row positions give
each row's full-forward logits, for every position embedding, also when attention reads only the
slots written so far (`num_slots`); reusing the cache is safe."""

import pytest
import torch
from mds_model import GPT, GPTConfig, StaticKVCache

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


def rows(lengths: list[int], seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=generator) for n in lengths]


def decode_ragged(model, sequences, prompt_lengths, cache, *, trim=False):
    """Prefill right-padded prompts, then one token per row per step (each row's own next
    token); returns each row's logits at every position it fed. trim: attention reads only the
    slots up to the largest position fed (num_slots)."""
    batch, width = len(sequences), max(prompt_lengths)
    padded = torch.zeros(batch, width, dtype=torch.long)
    for b, (seq, n) in enumerate(zip(sequences, prompt_lengths, strict=True)):
        padded[b, :n] = seq[:n]
    positions = torch.arange(width).expand(batch, width)
    first = model.decode_static(
        padded, positions=positions, cache=cache, num_slots=width if trim else None
    )
    out = [[first[b, t] for t in range(n)] for b, n in enumerate(prompt_lengths)]
    steps = max(len(s) - n for s, n in zip(sequences, prompt_lengths, strict=True))
    position = torch.tensor(prompt_lengths)
    for _ in range(steps):
        index = position.clamp(max=torch.tensor([len(s) - 1 for s in sequences]))
        token = torch.stack([s[i] for s, i in zip(sequences, index.tolist(), strict=True)])
        logits = model.decode_static(
            token[:, None],
            positions=index[:, None],
            cache=cache,
            num_slots=int(index.max()) + 1 if trim else None,
        )
        for b, seq in enumerate(sequences):
            if position[b] < len(seq):
                out[b].append(logits[b, 0])
        position += 1
    return [torch.stack(o) for o in out]


@pytest.mark.parametrize("trim", [False, True], ids=["every-slot", "num-slots"])
@pytest.mark.parametrize("position", ["learned", "rotary", "alibi"])
def test_ragged_rows_match_each_rows_full_forward(position, trim):
    model = GPT(tiny(position_embedding_type=position), init_seed=3).eval()
    sequences = rows([12, 16, 7], seed=1)
    cache = StaticKVCache(model.config, batch_size=3, max_length=SEQ)
    with torch.no_grad():
        got = decode_ragged(model, sequences, [3, 9, 5], cache, trim=trim)
        for seq, logits in zip(sequences, got, strict=True):
            full = model.logits(seq[None])[0]
            torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


def test_a_reused_cache_never_shows_the_last_calls_tokens():
    model = GPT(tiny(), init_seed=4).eval()
    cache = StaticKVCache(model.config, batch_size=2, max_length=SEQ)
    with torch.no_grad():
        decode_ragged(model, rows([16, 16], seed=2), [10, 14], cache)  # fills every slot
        sequences = rows([8, 6], seed=3)
        got = decode_ragged(model, sequences, [2, 4], cache)
        for seq, logits in zip(sequences, got, strict=True):
            torch.testing.assert_close(logits, model.logits(seq[None])[0], rtol=1e-5, atol=1e-5)


def test_output_index_picks_one_position_per_row():
    model = GPT(tiny(), init_seed=5).eval()
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(6).expand(2, 6)
    with torch.no_grad():
        every = model.decode_static(
            tokens,
            positions=positions,
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
        )
        picked = model.decode_static(
            tokens,
            positions=positions,
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
            output_index=torch.tensor([2, 5]),
        )
    assert picked.shape == (2, 1, 128)
    torch.testing.assert_close(picked[:, 0], every[[0, 1], [2, 5]])


def test_bad_shapes_are_errors():
    model = GPT(tiny(), init_seed=0).eval()
    with pytest.raises(ValueError, match="max_length must be in 1..16"):
        StaticKVCache(model.config, batch_size=1, max_length=17)
    cache = StaticKVCache(model.config, batch_size=2, max_length=8)
    with pytest.raises(ValueError, match=r"must both be \(batch 2, S_new\)"):
        model.decode_static(
            torch.zeros(1, 1, dtype=torch.long), positions=torch.zeros(1, 1), cache=cache
        )
    with pytest.raises(ValueError, match="num_slots must be in 1..8, got 9"):
        model.decode_static(
            torch.zeros(2, 1, dtype=torch.long),
            positions=torch.zeros(2, 1, dtype=torch.long),
            cache=cache,
            num_slots=9,
        )


def test_decode_static_hidden_is_the_head_s_input():
    model = GPT(tiny(), init_seed=7).eval()
    tokens = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    positions = torch.arange(5).expand(2, 5)
    index = torch.tensor([4, 1])
    with torch.no_grad():
        hidden = model.decode_static_hidden(
            tokens,
            positions=positions,
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
            output_index=index,
        )
        logits = model.decode_static(
            tokens,
            positions=positions,
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
            output_index=index,
        )
    assert hidden.shape == (2, 1, 32)
    torch.testing.assert_close(hidden @ model.embedding.word_embeddings.weight.t(), logits)


def test_one_layers_decode_static_is_its_forward():
    model = GPT(tiny(), init_seed=6).eval()
    layer = model.layers[0]
    x = torch.randn(5, 2, 32, generator=torch.Generator().manual_seed(1))  # (S, B, H)
    cache = StaticKVCache(model.config, batch_size=2, max_length=8)
    positions = torch.arange(5).expand(2, 5)
    with torch.no_grad():
        got = layer.decode_static(
            x, cache=cache.layers[0], positions=positions, bias=cache.attention_bias(positions)
        )
        torch.testing.assert_close(got, layer(x), rtol=1e-5, atol=1e-5)
