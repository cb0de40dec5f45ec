"""The sampling filters on known distributions: top-k, top-p (the crossing token kept), temperature,
penalties, greedy, and seeded draws."""

import math

import pytest
import torch
from mds_generate import Sampler, SamplingConfig, top_k_filter, top_p_filter
from mds_generate.sampling import filtered_logits

INF = float("-inf")


def log_probs(*probs: float) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]])


def kept(logits: torch.Tensor) -> list[int]:
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def test_top_k_keeps_the_k_largest_and_their_ties():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert top_k_filter(logits, 2).tolist() == [[INF, 4.0, 3.0, INF]]
    assert kept(top_k_filter(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), 1)) == [1, 2]  # logit >= k-th
    assert torch.equal(top_k_filter(logits, 0), logits)  # off
    assert torch.equal(top_k_filter(logits, 9), logits)


@pytest.mark.parametrize(
    ("p", "expected"),
    [(0.4, [0]), (0.6, [0, 1]), (0.85, [0, 1, 2]), (0.97, [0, 1, 2, 3]), (0.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_the_token_that_crosses_p(p, expected):
    # Sorted probabilities 0.5, 0.3, 0.15, 0.05 (cumulative 0.5, 0.8, 0.95, 1.0), shuffled.
    logits = log_probs(0.15, 0.5, 0.05, 0.3)
    order = [1, 3, 0, 2]  # most probable first
    assert kept(top_p_filter(logits, p)) == sorted(order[: len(expected)])


def test_top_k_runs_before_top_p():
    config = SamplingConfig(top_k=2, top_p=0.6)
    # top-k leaves 0.5 and 0.3 (renormalised 0.625, 0.375): top-p 0.6 then keeps only the first.
    assert kept(filtered_logits(log_probs(0.5, 0.3, 0.15, 0.05), config)) == [0]


def frequencies(config: SamplingConfig, probs, num: int = 40000) -> torch.Tensor:
    sampler = Sampler(config, vocab_size=len(probs), device=torch.device("cpu"))
    sampler.start([[0]] * num)
    draws = sampler(log_probs(*probs).expand(num, -1))
    return torch.bincount(draws, minlength=len(probs)).double() / num


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_reshapes_the_distribution(temperature):
    probs = [0.6, 0.3, 0.1]
    expected = torch.tensor([p ** (1 / temperature) for p in probs], dtype=torch.float64)
    expected /= expected.sum()
    got = frequencies(SamplingConfig(temperature=temperature), probs)
    torch.testing.assert_close(got, expected, atol=0.012, rtol=0)


def test_top_p_draws_follow_the_renormalised_nucleus():
    got = frequencies(SamplingConfig(top_p=0.6), [0.5, 0.3, 0.15, 0.05])
    torch.testing.assert_close(
        got, torch.tensor([0.625, 0.375, 0.0, 0.0], dtype=torch.float64), atol=0.012, rtol=0
    )


def test_greedy_is_argmax_whatever_the_temperature():
    sampler = Sampler(
        SamplingConfig(greedy=True, temperature=100.0), vocab_size=3, device=torch.device("cpu")
    )
    sampler.start([[0]])
    assert sampler(torch.tensor([[0.1, 0.3, 0.2, 9.0]])).tolist() == [1]  # padding column dropped


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    config = SamplingConfig(greedy=True, repetition_penalty=1.2)
    sampler = Sampler(config, vocab_size=3, device=torch.device("cpu"))
    sampler.start([[0], [2]])  # row 0 has seen token 0, row 1 token 2
    logits = torch.tensor([[2.0, 1.9, -1.0], [-1.0, -1.1, -0.95]])
    # row 0: 2.0 / 1.2 < 1.9; row 1: -0.95 * 1.2 = -1.14 < -1.0
    assert sampler(logits).tolist() == [1, 0]


def test_frequency_penalty_counts_generated_tokens():
    config = SamplingConfig(greedy=True, frequency_penalty=0.15)
    sampler = Sampler(config, vocab_size=3, device=torch.device("cpu"))
    sampler.start([[1, 1, 1]])  # the prompt does not count
    logits = torch.tensor([[1.0, 0.9, 0.8]])
    assert [sampler(logits).item() for _ in range(4)] == [0, 1, 0, 2]


def test_the_same_seed_gives_the_same_draws():
    def draws(seed: int) -> list[int]:
        sampler = Sampler(SamplingConfig(seed=seed), vocab_size=50, device=torch.device("cpu"))
        sampler.start([[0]] * 4)
        logits = torch.zeros(4, 50)
        return [sampler(logits).tolist() for _ in range(5)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("temperature", 0.0, "--temperature"),
        ("top_k", -1, "--top-k"),
        ("top_p", 1.5, "--top-p"),
        ("repetition_penalty", 0.0, "--repetition-penalty"),
        ("seed", -1, "--seed"),
    ],
)
def test_bad_values_name_the_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        SamplingConfig(**{field: value})


def test_only_plain_greedy_may_be_fused_with_the_head():
    """The CPU step returns the argmax itself for a plain greedy sampler only: not with
    penalties, not when sampling, not for a subclass that must see the logits."""

    class Forcing(Sampler):
        def __call__(self, logits):
            return super().__call__(logits)

    def started(cls, **config):
        sampler = cls(SamplingConfig(**config), vocab_size=10, device=torch.device("cpu"))
        sampler.start([[1, 2]])
        return sampler

    assert started(Sampler, greedy=True).plain_greedy
    assert not started(Sampler, greedy=True, repetition_penalty=1.2).plain_greedy
    assert not started(Sampler, greedy=True, frequency_penalty=0.5).plain_greedy
    assert not started(Sampler, top_k=3).plain_greedy
    assert not started(Forcing, greedy=True).plain_greedy
