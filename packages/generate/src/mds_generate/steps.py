"""Where each step's logits come from: the static KV cache (eager, or one CUDA graph replay per
step) or a full recomputation of every row (`--recompute`, the cache's check).

Both take a batch of prompts (one list of ids per row, any lengths) and return the logits that
predict each row's next token; the generation loop (engine.py) is the same for both.
"""

from __future__ import annotations

import torch
from mds_model import GPT, StaticKVCache

# Cache lengths are rounded up to this, so prompts of nearby lengths share a cache and a graph.
LENGTH_BUCKET = 64
MAX_KEPT = 4  # caches (and their graphs) kept for reuse, the oldest dropped first


def pad_rows(prompts: list[list[int]], *, width: int, pad: int, device) -> torch.Tensor:
    """Right-padded (B, width) int64."""
    padded = torch.full((len(prompts), width), pad, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        padded[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
    return padded.to(device)


class CachedSteps:
    """Per-row positions in a preallocated cache: prefill the right-padded prompts, then one
    token per row at that row's next position. On CUDA each one-token step is a CUDA graph."""

    def __init__(self, model: GPT, *, device: torch.device, cuda_graphs: bool) -> None:
        self.model, self.device = model, device
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self._kept: dict[tuple[int, int], tuple[StaticKVCache, _OneTokenStep]] = {}
        self._pool = None  # one CUDA graph memory pool shared by every captured step

    def start(self, prompts: list[list[int]], *, max_length: int, pad: int) -> torch.Tensor:
        """Prefills the prompts; returns the logits (B, V) after each row's last prompt token.
        max_length: the largest position any row will feed + 1."""
        batch, width = len(prompts), max(len(p) for p in prompts)
        length = min(
            -(-max_length // LENGTH_BUCKET) * LENGTH_BUCKET, self.model.config.max_positions
        )
        self.cache, self.step = self._cache_and_step(batch, max(length, width))
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        tokens = pad_rows(prompts, width=width, pad=pad, device=self.device)
        positions = torch.arange(width, device=self.device).expand(batch, width)
        logits = self.model.decode_static(
            tokens, positions=positions, cache=self.cache, output_index=lengths - 1
        )
        return logits[:, 0]

    def next(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions (B,) -> logits (B, V) predicting the token after each."""
        return self.step(tokens, positions)

    def _cache_and_step(self, batch: int, length: int):
        key = (batch, length)
        if key in self._kept:
            self._kept[key] = self._kept.pop(key)  # most recently used last
            return self._kept[key]
        if len(self._kept) >= MAX_KEPT:
            del self._kept[next(iter(self._kept))]
        cache = StaticKVCache(
            self.model.config, batch_size=batch, max_length=length, device=self.device
        )
        if self.cuda_graphs and self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        step = _OneTokenStep(self.model, cache, graph_pool=self._pool if self.cuda_graphs else None)
        self._kept[key] = (cache, step)
        return cache, step


class _OneTokenStep:
    """`GPT.decode_static` of one token per row; with a graph pool, captured once as a CUDA graph
    (static input buffers, replayed each step: no per-kernel launch cost)."""

    def __init__(self, model: GPT, cache: StaticKVCache, *, graph_pool) -> None:
        self.model, self.cache, self.graph = model, cache, None
        if graph_pool is None:
            return
        batch, device = cache.batch_size, cache.layers[0].keys.device
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, 1, dtype=torch.long, device=device)
        # Warm-up and capture write into slot 0, which the prefill overwrites before any read.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # Triton autotuning and cuBLAS workspaces happen here
                self._eager(self.tokens, self.positions)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=graph_pool):
            self.logits = self._eager(self.tokens, self.positions)

    def _eager(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model.decode_static(tokens, positions=positions, cache=self.cache)[:, 0]

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            return self._eager(tokens[:, None], positions[:, None])
        self.tokens.copy_(tokens[:, None])
        self.positions.copy_(positions[:, None])
        self.graph.replay()
        return self.logits


class RecomputedSteps:
    """No cache: every step runs the whole right-padded batch through `GPT.logits` and reads each
    row's logits at its last position (causal attention: the padding after it is never seen)."""

    def __init__(self, model: GPT, *, device: torch.device) -> None:
        self.model, self.device = model, device

    def start(self, prompts: list[list[int]], *, max_length: int, pad: int) -> torch.Tensor:
        batch = len(prompts)
        self.lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        self.tokens = torch.full((batch, max_length + 1), pad, dtype=torch.long, device=self.device)
        width = max(len(p) for p in prompts)
        self.tokens[:, :width] = pad_rows(prompts, width=width, pad=pad, device=self.device)
        return self._last_logits(self.lengths)

    def next(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(tokens.shape[0], device=self.device)
        self.tokens[rows, positions] = tokens
        return self._last_logits(positions + 1)

    def _last_logits(self, lengths: torch.Tensor) -> torch.Tensor:
        width = int(lengths.max())
        logits = self.model.logits(self.tokens[:, :width])  # (B, width, V)
        return logits[torch.arange(logits.shape[0], device=self.device), lengths - 1]
