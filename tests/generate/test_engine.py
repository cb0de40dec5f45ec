"""The generation loop on a TP=1 model in memory: the KV cache gives `--recompute`'s tokens,
batched and one prompt at a time, with prompts of mixed lengths; endings and seeds."""

import pytest
import torch
from mds_generate import GenerationConfig, Generator, Sampler, SamplingConfig

CPU = torch.device("cpu")
EOD = 4999  # the tiny vocabulary's <|endoftext|>
PROMPTS = [
    "The history of the city",
    "A",
    "In 1998 the company announced that it would build a new factory near the river, and",
    "Hello, world. Hello",
]


@pytest.fixture(scope="module")
def generator(tiny_model, tokenizer) -> Generator:
    return Generator(tiny_model, tokenizer, device=CPU)


def run(generator, prompts, *, recompute=False, sampling=None, **generation):
    sampler = Sampler(sampling or SamplingConfig(greedy=True), vocab_size=5000, device=CPU)
    config = GenerationConfig(recompute=recompute, **{"max_new_tokens": 24, **generation})
    return generator.generate(prompts, sampler=sampler, generation=config)


def test_cached_greedy_equals_recompute_batched_and_alone(generator, tokenizer):
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    assert len({len(p) for p in prompts}) == len(prompts)  # mixed lengths
    cached = run(generator, prompts)
    recomputed = run(generator, prompts, recompute=True)
    alone = [run(generator, [p])[0] for p in prompts]
    alone_recomputed = [run(generator, [p], recompute=True)[0] for p in prompts]
    for completions in (recomputed, alone, alone_recomputed):
        assert [c.token_ids for c in completions] == [c.token_ids for c in cached]
    for completion in cached:
        assert len(completion.token_ids) == 24 and completion.finish_reason == "length"
        assert len(set(completion.token_ids)) > 3  # varied text, not one token repeated


def test_sampled_cache_equals_recompute_with_the_same_seed(generator, tokenizer):
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    sampling = SamplingConfig(temperature=0.8, top_k=50, top_p=0.9, seed=3)
    cached = run(generator, prompts, sampling=sampling)
    again = run(generator, prompts, sampling=sampling)
    recomputed = run(generator, prompts, recompute=True, sampling=sampling)
    other_seed = run(generator, prompts, sampling=SamplingConfig(temperature=0.8, seed=4))
    assert [c.token_ids for c in cached] == [c.token_ids for c in again]
    assert [c.token_ids for c in cached] == [c.token_ids for c in recomputed]
    assert [c.token_ids for c in cached] != [c.token_ids for c in other_seed]


def test_rows_end_at_end_of_document_and_the_others_carry_on(generator, tokenizer):
    prompts = [tokenizer.encode(text) for text in PROMPTS[:2]]
    free = run(generator, prompts, max_new_tokens=12)
    # The sampler is made to emit end-of-document as row 0's fourth token.
    forced = _with_eod_at(generator, prompts, row=0, step=3)
    assert forced[0].token_ids == free[0].token_ids[:3] and forced[0].finish_reason == "eod"
    assert forced[1].token_ids == free[1].token_ids and forced[1].finish_reason == "length"


def _with_eod_at(generator, prompts, *, row, step):
    class EodAt(Sampler):
        calls = 0

        def __call__(self, logits):
            tokens = super().__call__(logits)
            if EodAt.calls == step:
                tokens[row] = EOD
            EodAt.calls += 1
            return tokens

    sampler = EodAt(SamplingConfig(greedy=True), vocab_size=5000, device=CPU)
    return generator.generate(
        prompts, sampler=sampler, generation=GenerationConfig(max_new_tokens=12)
    )


def test_stop_strings_cut_the_text_and_keep_the_ids_through_the_stop(generator, tokenizer):
    prompt = tokenizer.encode(PROMPTS[2])
    (free,) = run(generator, [prompt], max_new_tokens=24)
    stop = free.text[10:13]  # three characters from the middle of the free completion
    (stopped,) = run(generator, [prompt], max_new_tokens=24, stop=(stop, "never appears"))
    start = free.text.find(stop)
    assert stopped.finish_reason == "stop" and stopped.text == free.text[:start]
    assert stop in tokenizer.decode(list(stopped.token_ids))
    assert stop not in tokenizer.decode(list(stopped.token_ids[:-1]))
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]


def test_the_context_window_ends_a_row(generator, tokenizer):
    prompt = tokenizer.encode(PROMPTS[2])
    (completion,) = run(generator, [prompt], max_new_tokens=200, stop_at_eod=False)
    assert len(prompt) + len(completion.token_ids) == 128  # the tiny model's positions
    assert completion.finish_reason == "context"
    with pytest.raises(ValueError, match="leaves no room in the context of 128 tokens"):
        run(generator, [[1] * 128])
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        run(generator, [prompt], context_length=129)
