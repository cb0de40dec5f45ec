"""`Decoder.decode_static_hidden` over a preallocated `StaticKVCache`: ragged rows with per-row
positions give each row's full-forward logits, for every position embedding, also when attention
reads only the slots written so far (`num_slots`); reusing the cache is safe; the decoder reads
the model's own parameters."""

import pytest
import torch
from mds_model import GPT, Decoder, GPTConfig, KVCache, StaticKVCache

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


def decode_static(decoder: Decoder, tokens, **static) -> torch.Tensor:
    """Vocab-parallel logits of the static cache's step: its hidden states through the head."""
    return decoder.lm_head(decoder.decode_static_hidden(tokens, **static))


def decode_ragged(decoder, sequences, prompt_lengths, cache, *, trim=False):
    """Prefill right-padded prompts, then one token per row per step (each row's own next
    token); returns each row's logits at every position it fed. trim: attention reads only the
    slots up to the largest position fed (num_slots)."""
    batch, width = len(sequences), max(prompt_lengths)
    padded = torch.zeros(batch, width, dtype=torch.long)
    for b, (seq, n) in enumerate(zip(sequences, prompt_lengths, strict=True)):
        padded[b, :n] = seq[:n]
    positions = torch.arange(width).expand(batch, width)
    first = decode_static(
        decoder, padded, positions=positions, cache=cache, num_slots=width if trim else None
    )
    out = [[first[b, t] for t in range(n)] for b, n in enumerate(prompt_lengths)]
    steps = max(len(s) - n for s, n in zip(sequences, prompt_lengths, strict=True))
    position = torch.tensor(prompt_lengths)
    for _ in range(steps):
        index = position.clamp(max=torch.tensor([len(s) - 1 for s in sequences]))
        token = torch.stack([s[i] for s, i in zip(sequences, index.tolist(), strict=True)])
        logits = decode_static(
            decoder,
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
        got = decode_ragged(Decoder(model), sequences, [3, 9, 5], cache, trim=trim)
        for seq, logits in zip(sequences, got, strict=True):
            full = model.logits(seq[None])[0]
            torch.testing.assert_close(logits, full, rtol=1e-5, atol=1e-5)


def test_a_reused_cache_never_shows_the_last_calls_tokens():
    model = GPT(tiny(), init_seed=4).eval()
    cache, decoder = StaticKVCache(model.config, batch_size=2, max_length=SEQ), Decoder(model)
    with torch.no_grad():
        decode_ragged(decoder, rows([16, 16], seed=2), [10, 14], cache)  # fills every slot
        sequences = rows([8, 6], seed=3)
        got = decode_ragged(decoder, sequences, [2, 4], cache)
        for seq, logits in zip(sequences, got, strict=True):
            torch.testing.assert_close(logits, model.logits(seq[None])[0], rtol=1e-5, atol=1e-5)


def test_output_index_picks_one_position_per_row():
    model = GPT(tiny(), init_seed=5).eval()
    decoder = Decoder(model)
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(6).expand(2, 6)
    with torch.no_grad():
        every = decode_static(
            decoder,
            tokens,
            positions=positions,
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
        )
        picked = decode_static(
            decoder,
            tokens,
            positions=positions,
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
            output_index=torch.tensor([2, 5]),
        )
    assert picked.shape == (2, 1, 128)
    torch.testing.assert_close(picked[:, 0], every[[0, 1], [2, 5]])


def test_bad_shapes_are_errors():
    model = GPT(tiny(), init_seed=0).eval()
    decoder = Decoder(model)
    with pytest.raises(ValueError, match="max_length must be in 1..16"):
        StaticKVCache(model.config, batch_size=1, max_length=17)
    cache = StaticKVCache(model.config, batch_size=2, max_length=8)
    with pytest.raises(ValueError, match=r"must both be \(batch 2, S_new\)"):
        decoder.decode_static_hidden(
            torch.zeros(1, 1, dtype=torch.long), positions=torch.zeros(1, 1), cache=cache
        )
    with pytest.raises(ValueError, match="num_slots must be in 1..8, got 9"):
        decoder.decode_static_hidden(
            torch.zeros(2, 1, dtype=torch.long),
            positions=torch.zeros(2, 1, dtype=torch.long),
            cache=cache,
            num_slots=9,
        )


def test_the_head_over_the_hidden_states_is_the_tied_embedding_product():
    model = GPT(tiny(), init_seed=7).eval()
    decoder = Decoder(model)
    tokens = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden = decoder.decode_static_hidden(
            tokens,
            positions=torch.arange(5).expand(2, 5),
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
            output_index=torch.tensor([4, 1]),
        )
        logits = decoder.lm_head(hidden)
    assert hidden.shape == (2, 1, 32)
    assert logits.shape == (2, 1, 128)
    torch.testing.assert_close(logits, hidden @ model.embedding.word_embeddings.weight.t())


def test_one_layer_on_the_static_cache_is_its_forward():
    """A one-layer model: its static decoding is the layer's forward between the embedding and
    the final LayerNorm (the layer's fused residual adds give the same sums)."""
    model = GPT(tiny(num_layers=1), init_seed=6).eval()
    tokens = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = Decoder(model).decode_static_hidden(
            tokens,
            positions=torch.arange(5).expand(2, 5),
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
        )
        x = model.embedding(tokens).transpose(0, 1)  # (S, B, H)
        want = model.final_layernorm(model.layers[0](x)).transpose(0, 1)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_decoder_reads_the_model_s_parameters_as_they_are_now():
    """Parameters loaded into the model after the decoder was made are the ones it decodes with
    (shared, not copied), in both caches."""
    model = GPT(tiny(), init_seed=8).eval()
    decoder = Decoder(model)
    model.load_state_dict(GPT(tiny(), init_seed=9).state_dict())
    tokens = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model.logits(tokens)
        static = decode_static(
            decoder,
            tokens,
            positions=torch.arange(6).expand(2, 6),
            cache=StaticKVCache(model.config, batch_size=2, max_length=8),
        )
        growing = decoder.decode(tokens, cache=KVCache(model.config.num_layers))
    torch.testing.assert_close(static, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(growing, want, rtol=1e-5, atol=1e-5)
