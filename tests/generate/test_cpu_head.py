"""CPU decoding's LM head (`CpuLmHead`): its two layouts give `F.linear`'s logits over the real
vocabulary and their argmax (ties to the first, the padding never chosen), follow the
embeddings when they change in place, and the Generator's CPU steps (which
use it, with attention over the written slots only) give `--recompute`'s tokens (test_engine.py,
at 1 and 4 rows) and those of the compiled step (its layers compiled, over every slot)."""

import pytest
import torch
import torch.nn.functional as F
from mds_generate import GenerationConfig, Generator, Sampler, SamplingConfig
from mds_generate.cpu_head import BLOCK, MIN_BLOCKED_ROWS, CpuLmHead

CPU = torch.device("cpu")


@pytest.mark.parametrize("rows", [1, MIN_BLOCKED_ROWS - 1, MIN_BLOCKED_ROWS, 8])
def test_logits_are_f_linear_s_over_the_real_vocabulary(rows):
    generator = torch.Generator().manual_seed(rows)
    vocab = 3 * BLOCK + 5  # a last block part-filled
    embeddings = torch.randn(vocab + 11, 64, generator=generator)  # Megatron's padding rows
    hidden = torch.randn(rows, 64, generator=generator)
    logits = CpuLmHead(embeddings, vocab_size=vocab)(hidden)
    assert logits.shape == (rows, vocab)
    torch.testing.assert_close(logits, F.linear(hidden, embeddings)[:, :vocab])


@pytest.mark.parametrize("rows", [1, MIN_BLOCKED_ROWS - 1, MIN_BLOCKED_ROWS, 8])
def test_greedy_is_the_argmax_of_the_logits(rows):
    generator = torch.Generator().manual_seed(10 + rows)
    vocab = 3 * BLOCK + 5
    embeddings = torch.randn(vocab + 11, 64, generator=generator)
    embeddings[vocab:] = 0.0  # the padding's logits are 0, above every real one below
    embeddings[BLOCK + 7] = embeddings[2 * BLOCK + 1] = embeddings[BLOCK - 1]  # a three-way tie
    hidden = torch.randn(rows, 64, generator=generator)
    head = CpuLmHead(embeddings, vocab_size=vocab)
    logits = F.linear(hidden, embeddings)[:, :vocab]
    torch.testing.assert_close(head.greedy(hidden), logits.argmax(dim=-1), rtol=0, atol=0)
    # Every real logit negative: the first tied one wins, never a padding column.
    embeddings[:vocab] = -embeddings[:vocab].abs() - 1.0
    embeddings[BLOCK + 7] = embeddings[2 * BLOCK + 1] = embeddings[BLOCK - 1] = -0.5
    hidden = torch.ones(rows, 64)
    assert head.greedy(hidden).tolist() == [BLOCK - 1] * rows


def test_the_copies_follow_the_embeddings_changed_in_place():
    embeddings = torch.randn(300, 32, generator=torch.Generator().manual_seed(0))
    head = CpuLmHead(embeddings, vocab_size=300)
    for rows in (1, 8):
        hidden = torch.randn(rows, 32)
        head(hidden)  # builds the copy
        embeddings.mul_(2.0)  # as load_state_dict's copy_ would
        torch.testing.assert_close(head(hidden), hidden @ embeddings.t())


def test_a_tensor_off_the_cpu_is_refused():
    with pytest.raises(ValueError, match="CPU decoding"):
        CpuLmHead(torch.empty(4, 4, device="meta"), vocab_size=4)


def test_the_cpu_steps_use_it(tiny_model, tokenizer):
    for compile in (False, True):
        generator = Generator(tiny_model, tokenizer, device=CPU, compile=compile)
        assert isinstance(generator._cached.cpu_head, CpuLmHead)


def test_compiled_cpu_step_gives_the_eager_tokens(tiny_model, tokenizer):
    prompts = [tokenizer.encode(text) for text in ["The history of the city", "A", "Hello"]]
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=5000, device=CPU)
    config = GenerationConfig(max_new_tokens=12)
    eager = Generator(tiny_model, tokenizer, device=CPU)
    compiled = Generator(tiny_model, tokenizer, device=CPU, compile=True)
    expected = eager.generate(prompts, sampler=sampler, generation=config)
    got = compiled.generate(prompts, sampler=sampler, generation=config)  # compiles (~10 s)
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    assert all(len(c.token_ids) == 12 for c in expected)
