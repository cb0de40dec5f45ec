"""Where each step's logits come from: the static KV cache (eager, or one CUDA graph replay per
step) or a full recomputation of every row (`--recompute`, the cache's check). Eager on CPU, the
LM head (tied or untied) runs over `CpuLmHead`'s copies and attention reads only the slots
written so far.

Both take a batch of prompts (one list of ids per row, any lengths) and return the logits that
predict each row's next token (or, with `greedy=True` where `fuses_greedy`, the argmax tokens
themselves); the generation loop (engine.py) is the same for both.
"""

from __future__ import annotations

import torch
from mds_model import GPT, Decoder, StaticKVCache

from .cpu_head import CpuLmHead

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
    token per row at that row's next position. On CUDA each one-token step is a CUDA graph. On
    CPU the head is `CpuLmHead`; eager steps attend over the slots written so far, and with
    compile the layers of the one-token step are compiled (one shape: every slot) while the head
    stays eager (inductor would run F.linear's slow layout)."""

    def __init__(
        self,
        model: GPT,
        *,
        device: torch.device,
        cuda_graphs: bool,
        compile: bool = False,
        vocab_size: int | None = None,
    ) -> None:
        """vocab_size: the logits' columns that `CpuLmHead` computes (None: the model's)."""
        self.model, self.device = model, device
        self.decoder = Decoder(model)  # the fused decoding paths, over the model's parameters
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        if compile and model.config.use_fused_kernels:
            raise ValueError(
                "torch.compile traces the pure-torch path: build the model with "
                "use_fused_kernels=False to compile its decoding step"
            )
        self._kept: dict[tuple[int, int], tuple[StaticKVCache, _OneTokenStep]] = {}
        self.cpu_head = None
        if device.type == "cpu" and model.groups.tp_size == 1:
            self.cpu_head = CpuLmHead(
                model.head_weight, vocab_size=vocab_size or model.config.vocab_size
            )
        # torch.compile of the one-token step (fuses the small ops); compiled once per shape.
        function = _decode_one if self.cpu_head is None else _decode_one_hidden
        self.compiled = torch.compile(function, fullgraph=True, dynamic=False) if compile else None

    @property
    def fuses_greedy(self) -> bool:
        return self.cpu_head is not None

    def start(
        self, prompts: list[list[int]], *, max_length: int, pad: int, greedy: bool = False
    ) -> torch.Tensor:
        """Prefills the prompts; returns the logits (B, V) after each row's last prompt token
        (their argmax (B,) with greedy, where `fuses_greedy`). max_length: the largest position
        any row will feed + 1."""
        batch, width = len(prompts), max(len(p) for p in prompts)
        length = min(
            -(-max_length // LENGTH_BUCKET) * LENGTH_BUCKET, self.model.config.max_positions
        )
        self.cache, self.step = self._cache_and_step(batch, max(length, width))
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        tokens = pad_rows(prompts, width=width, pad=pad, device=self.device)
        positions = torch.arange(width, device=self.device).expand(batch, width)
        if self.cpu_head is not None:
            hidden = self.decoder.decode_static_hidden(
                tokens,
                positions=positions,
                cache=self.cache,
                output_index=lengths - 1,
                num_slots=width,
            )
            return self._head(hidden[:, 0], greedy=greedy)
        hidden = self.decoder.decode_static_hidden(
            tokens, positions=positions, cache=self.cache, output_index=lengths - 1
        )
        return self.decoder.lm_head(hidden)[:, 0]

    def next(
        self, tokens: torch.Tensor, positions: torch.Tensor, *, greedy: bool = False
    ) -> torch.Tensor:
        """tokens, positions (B,) -> logits (B, V or padded V) predicting the token after each
        (their argmax (B,) with greedy, where `fuses_greedy`)."""
        if self.cpu_head is None:
            return self.step(tokens, positions)
        if self.compiled is not None:
            hidden = self.compiled(self.decoder, tokens[:, None], positions[:, None], self.cache)
            return self._head(hidden, greedy=greedy)
        # Reading the largest position is free on CPU; the slots past it are never seen.
        hidden = self.decoder.decode_static_hidden(
            tokens[:, None],
            positions=positions[:, None],
            cache=self.cache,
            num_slots=int(positions.max()) + 1,
        )
        return self._head(hidden[:, 0], greedy=greedy)

    def _head(self, hidden: torch.Tensor, *, greedy: bool) -> torch.Tensor:
        return self.cpu_head.greedy(hidden) if greedy else self.cpu_head(hidden)

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
        step = None  # CPU: `next` runs the step itself, over the slots or compiled
        if self.cpu_head is None:
            step = _OneTokenStep(
                self.decoder,
                cache,
                cuda_graph=self.cuda_graphs,
                function=self.compiled or _decode_one,
            )
        self._kept[key] = (cache, step)
        return cache, step


def _decode_one(decoder: Decoder, tokens, positions, cache: StaticKVCache) -> torch.Tensor:
    """(B, 1) tokens at (B, 1) positions -> logits (B, V)."""
    hidden = decoder.decode_static_hidden(tokens, positions=positions, cache=cache)
    return decoder.lm_head(hidden)[:, 0]


def _decode_one_hidden(decoder: Decoder, tokens, positions, cache: StaticKVCache) -> torch.Tensor:
    """(B, 1) tokens at (B, 1) positions -> the head's input (B, H)."""
    return decoder.decode_static_hidden(tokens, positions=positions, cache=cache)[:, 0]


class _OneTokenStep:
    """`Decoder.decode_static_hidden` and the LM head of one token per row; on CUDA captured as
    a CUDA graph on its first call (static input buffers, replayed each step: no per-kernel
    launch cost)."""

    def __init__(
        self, decoder: Decoder, cache: StaticKVCache, *, cuda_graph: bool, function
    ) -> None:
        self.decoder, self.cache, self.function = decoder, cache, function
        self.cuda_graph, self.graph = cuda_graph, None

    def _capture(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        self.tokens, self.positions = tokens.clone(), positions.clone()
        # Warm-up and capture write the keys and values of the real next step, which the replay
        # below writes again: nothing else in the cache changes.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # compilation, Triton autotuning and cuBLAS workspaces happen here
                self.function(self.decoder, self.tokens, self.positions, self.cache)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.function(self.decoder, self.tokens, self.positions, self.cache)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        tokens, positions = tokens[:, None], positions[:, None]
        if not self.cuda_graph:
            return self.function(self.decoder, tokens, positions, self.cache)
        if self.graph is None:
            self._capture(tokens, positions)
        else:
            self.tokens.copy_(tokens)
            self.positions.copy_(positions)
        self.graph.replay()
        return self.logits


class RecomputedSteps:
    """No cache: every step runs the whole right-padded batch through `GPT.logits` and reads each
    row's logits at its last position (causal attention: the padding after it is never seen)."""

    fuses_greedy = False

    def __init__(self, model: GPT, *, device: torch.device) -> None:
        self.model, self.device = model, device

    def start(
        self, prompts: list[list[int]], *, max_length: int, pad: int, greedy: bool = False
    ) -> torch.Tensor:
        batch = len(prompts)
        self.lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        self.tokens = torch.full((batch, max_length + 1), pad, dtype=torch.long, device=self.device)
        width = max(len(p) for p in prompts)
        self.tokens[:, :width] = pad_rows(prompts, width=width, pad=pad, device=self.device)
        return self._last_logits(self.lengths)

    def next(
        self, tokens: torch.Tensor, positions: torch.Tensor, *, greedy: bool = False
    ) -> torch.Tensor:
        rows = torch.arange(tokens.shape[0], device=self.device)
        self.tokens[rows, positions] = tokens
        return self._last_logits(positions + 1)

    def _last_logits(self, lengths: torch.Tensor) -> torch.Tensor:
        width = int(lengths.max())
        logits = self.model.logits(self.tokens[:, :width])  # (B, width, V)
        return logits[torch.arange(logits.shape[0], device=self.device), lengths - 1]
