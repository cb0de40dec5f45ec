"""Picking the next token from logits: penalties, greedy, temperature, top-k, top-p, a seeded draw.

Temperature, top-k then top-p and `torch.multinomial` on the softmax follow Megatron's
`generate_samples_gpt.py` (top-k keeps logits >= the k-th largest; top-p keeps the smallest prefix
of the sorted tokens whose probability reaches p, the token that crosses p included). The
repetition penalty is CTRL's (Keskar et al. 2019, as Hugging Face applies it: a seen token's
positive logit is divided by the penalty, a negative one multiplied), counting prompt and
completion; the frequency penalty is OpenAI's (logit minus penalty x times the token was
generated), counting the completion only.
"""

from __future__ import annotations

import torch
from mds_model.kernels import triton_available
from mds_model.kernels.skinny_linear import greedy_argmax

from .config import SamplingConfig


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits if temperature == 1.0 else logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits (B, V): everything below the k-th largest of its row becomes -inf (ties kept)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """logits (B, V): keep the most probable tokens until their probability reaches p, the one
    that crosses p included; the rest become -inf. p <= 0 or >= 1 is off."""
    if p <= 0.0 or p >= 1.0:
        return logits
    ordered, order = torch.sort(logits, dim=-1, descending=True)
    cumulative = torch.softmax(ordered.float(), dim=-1).cumsum(dim=-1)
    remove = cumulative > p
    remove[..., 1:] = remove[..., :-1].clone()  # shift right: the crossing token stays
    remove[..., 0] = False
    return logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: float
) -> torch.Tensor:
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def filtered_logits(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (Megatron's order), in fp32."""
    logits = apply_temperature(logits.float(), config.temperature)
    return top_p_filter(top_k_filter(logits, config.top_k), config.top_p)


class Sampler:
    """Draws one token per row from each step's logits; holds the seeded generator and the
    counts the penalties need. `start(prompts)` before a batch, then `__call__` each step."""

    def __init__(self, config: SamplingConfig, *, vocab_size: int, device: torch.device) -> None:
        self.config, self.vocab_size, self.device = config, vocab_size, device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(config.seed)
        self._seen: torch.Tensor | None = None  # (B, V) bool: in the prompt or generated
        self._counts: torch.Tensor | None = None  # (B, V): times generated

    def start(self, prompts: list[list[int]]) -> None:
        """Resets the penalties' counts for a new batch (the seed carries on)."""
        batch, vocab = len(prompts), self.vocab_size
        self._seen = self._counts = None
        if self.config.repetition_penalty != 1.0:
            self._seen = torch.zeros(batch, vocab, dtype=torch.bool, device=self.device)
            for row, prompt in enumerate(prompts):
                self._seen[row, torch.tensor(prompt, dtype=torch.long, device=self.device)] = True
        if self.config.frequency_penalty != 0.0:
            self._counts = torch.zeros(batch, vocab, dtype=torch.float32, device=self.device)

    @property
    def plain_greedy(self) -> bool:
        """Greedy without penalties: the argmax alone, which a step may fuse with its head
        (not where a subclass overrides `__call__`: it must see the logits)."""
        return type(self).__call__ is Sampler.__call__ and self._argmax_only

    @property
    def _argmax_only(self) -> bool:
        return self.config.greedy and self._seen is None and self._counts is None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (B, >= V) -> next tokens (B,) int64; columns past the vocabulary (Megatron's
        padding) are dropped."""
        config = self.config
        if self._argmax_only:  # in the logits' dtype: the same argmax, no copy
            use_kernel = logits.is_cuda and triton_available()
            return greedy_argmax(logits, num_cols=self.vocab_size, use_kernel=use_kernel)
        logits = logits[:, : self.vocab_size]
        logits = logits.float()
        if self._seen is not None:
            logits = apply_repetition_penalty(logits, self._seen, config.repetition_penalty)
        if self._counts is not None:
            logits = logits - config.frequency_penalty * self._counts
        if config.greedy:
            tokens = logits.argmax(dim=-1)
        else:
            probs = torch.softmax(filtered_logits(logits, config), dim=-1)
            tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(1)
        if self._seen is not None:
            self._seen.scatter_(1, tokens[:, None], True)
        if self._counts is not None:
            self._counts.scatter_add_(
                1, tokens[:, None], torch.ones_like(tokens, dtype=torch.float32)[:, None]
            )
        return tokens
