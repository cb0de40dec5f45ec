"""The generation loop: a batch of prompts of any lengths in, one `Completion` per prompt out.

Each row ends at end-of-document, at a stop string, after `max_new_tokens`, or where the context
window is full, whichever comes first; the others carry on. The loop never waits on the device
except every `CHECK_EVERY` steps (are all rows done?) or, when streaming, every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from mds_model import GPT
from mds_tokenize.interface import Tokenizer

from .config import GenerationConfig
from .sampling import Sampler
from .steps import CachedSteps, RecomputedSteps

CHECK_EVERY = 16


@dataclass(frozen=True)
class Completion:
    """One prompt's result. `token_ids`: the generated ids that make `text` (the end-of-document
    token left out; with a stop string, up to the token that completed it, while `text` ends
    before the stop string). `finish_reason`: eod, stop, length (max_new_tokens) or context."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str


class Generator:
    """Generates with one model; keeps its preallocated caches (and CUDA graphs) between calls."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        *,
        device: torch.device,
        cuda_graphs: bool = True,
        compile: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        """vocab_size: the ids drawn from (the first ones; `LoadedModel.num_ids`), at most the
        model's vocab_size; None: the model's."""
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.vocab_size = vocab_size or model.config.vocab_size
        if self.vocab_size > model.config.vocab_size:
            raise ValueError(
                f"vocab_size {vocab_size}: the model has {model.config.vocab_size} ids"
            )
        self._cached = CachedSteps(
            model,
            device=device,
            cuda_graphs=cuda_graphs,
            compile=compile,
            vocab_size=self.vocab_size,
        )
        self._recomputed = RecomputedSteps(model, device=device)

    def context_length(self, generation: GenerationConfig) -> int:
        limit = self.model.config.max_positions
        if generation.context_length is not None and generation.context_length > limit:
            raise ValueError(
                f"--seq-length {generation.context_length} exceeds the model's "
                f"max_position_embeddings ({limit})"
            )
        return generation.context_length or limit

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        sampler: Sampler,
        generation: GenerationConfig,
        on_step: Callable[[list[int]], None] | None = None,
    ) -> list[Completion]:
        """prompts: one list of ids per row (each non-empty and shorter than the context).
        on_step: called with each step's new token of every row (the loop then syncs per step)."""
        context = self.context_length(generation)
        for prompt in prompts:
            if not prompt:
                raise ValueError("an empty prompt: give at least one token (e.g. end-of-document)")
            if len(prompt) >= context:
                raise ValueError(
                    f"a prompt of {len(prompt)} tokens leaves no room in the context of "
                    f"{context} tokens; shorten it (or raise --seq-length)"
                )
        budgets = [min(generation.max_new_tokens, context - len(p)) for p in prompts]
        num_steps = max(budgets)
        # The last generated token of a row is never fed back: its largest position is
        # len + budget - 2, so the cache needs len + budget - 1 slots.
        max_length = max(len(p) + b - 1 for p, b in zip(prompts, budgets, strict=True))
        max_length = max(max_length, max(len(p) for p in prompts))
        steps = self._recomputed if generation.recompute else self._cached
        eod = self.tokenizer.eod
        sampler.start(prompts)
        # Plain greedy on CPU: the step's head returns the argmax itself (no (B, V) logits).
        fused = sampler.plain_greedy and steps.fuses_greedy
        logits = steps.start(prompts, max_length=max_length, pad=eod, greedy=fused)
        # Each step's positions at once (a row past its budget feeds the last slot, never read)
        # and the budgets, checked only with `done` (a step's few kernels add up at batch 1).
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        offsets = torch.arange(1, num_steps, device=self.device)
        positions = (lengths + offsets[:, None] - 1).clamp(max=max_length - 1)  # (steps - 1, B)
        limits = torch.tensor(budgets, device=self.device)
        done = torch.zeros(len(prompts), dtype=torch.bool, device=self.device)  # at eod
        generated = torch.empty(len(prompts), num_steps, dtype=torch.long, device=self.device)
        for step in range(num_steps):
            tokens = logits if fused else sampler(logits)
            if generation.stop_at_eod:
                tokens = torch.where(done, eod, tokens)
                done |= tokens == eod
            generated[:, step] = tokens
            if on_step is not None:
                on_step(tokens.tolist())
            if step + 1 == num_steps:
                break
            if on_step is not None or (step + 1) % CHECK_EVERY == 0:
                finished = done | (limits <= step + 1)
                if self._all_finished(generated[:, : step + 1], finished, generation):
                    break
            logits = steps.next(tokens, positions[step], greedy=fused)
        rows = generated[:, : step + 1].tolist()
        return [
            self._completion(prompt, row[:budget], budget, generation)
            for prompt, row, budget in zip(prompts, rows, budgets, strict=True)
        ]

    def _all_finished(
        self, generated: torch.Tensor, done: torch.Tensor, generation: GenerationConfig
    ) -> bool:
        if not generation.stop:
            return bool(done.all())
        flags = done.tolist()
        if all(flags):
            return True
        for row, ids in zip(flags, generated.tolist(), strict=True):
            if not row and not self._stops(ids, generation):
                return False
        return True

    def _stops(self, ids: list[int], generation: GenerationConfig) -> bool:
        text = self.tokenizer.decode(ids)
        return any(stop in text for stop in generation.stop)

    def _completion(self, prompt, ids, budget, generation) -> Completion:
        reason = "length" if budget == generation.max_new_tokens else "context"
        if generation.stop_at_eod and self.tokenizer.eod in ids:
            ids, reason = ids[: ids.index(self.tokenizer.eod)], "eod"
        text = self.tokenizer.decode(ids)
        if generation.stop:
            found = _first_stop(text, generation.stop)
            if found is not None:
                start, stop = found
                ids = _ids_through(self.tokenizer, ids, start + len(stop))
                text, reason = text[:start], "stop"
        return Completion(tuple(prompt), tuple(ids), text, reason)


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """(where the earliest stop string starts in text, that string), or None."""
    found = [(text.find(stop), stop) for stop in stops if stop in text]
    return min(found) if found else None


def _ids_through(tokenizer: Tokenizer, ids: list[int], num_chars: int) -> list[int]:
    """The shortest prefix of ids whose text holds the first num_chars characters: up to the
    token that completed the stop string."""
    for end in range(1, len(ids) + 1):
        if len(tokenizer.decode(ids[:end]).rstrip("\ufffd")) >= num_chars:
            return ids[:end]
    return ids
