"""CUDA graphs over the transformer layers' forward and backward (Megatron-LM's
`--enable-cuda-graph`): each layer's training forward, and its backward, replay as one graph launch
instead of some fifty kernel launches issued by Python, so a slow or busy host no longer leaves the
GPU waiting (packages/train/README.md, "Profiling", measured where the host time went).

`torch.cuda.make_graphed_callables` captures every layer on a sample input of the micro-batch's
shape, sharing one memory pool; evaluation (`model.eval()`) runs the layers' own forward. A graph
replays its kernels on the buffers it captured: the caller keeps the shapes fixed and runs each
micro-batch's backward before the next forward, as a plain training loop does, and nothing in a
layer may need the host (dropout's RNG forks, activation recompute, FP8's per-step weight cache):
`unsupported` says which setting is in the way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .config import GPTConfig


def unsupported(config: GPTConfig) -> str | None:
    """Why the layers of `config` cannot be graphed, or None."""
    if config.hidden_dropout or config.attention_dropout:
        return (
            "dropout draws from RNG states the graphs would replay unchanged: give "
            "--hidden-dropout 0 --attention-dropout 0"
        )
    if config.activation_checkpointing != "none":
        return (
            "activation recompute restores RNG states inside the backward: drop "
            "--recompute-granularity and --checkpoint-activations"
        )
    if config.tensor_model_parallel_size > 1:
        return (
            "tensor-parallel collectives are not captured yet: use --tensor-model-parallel-size 1"
        )
    return None


def graph_layers(
    layers: Sequence[nn.Module], *, sample_shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """Replaces each layer's training forward (and so its backward) by graph replays, captured
    on random inputs of `sample_shape` (S, B, H) in `dtype` on the current CUDA device. Warm-up
    passes run first, as make_graphed_callables does; they compute gradients with
    `torch.autograd.grad`, so no parameter's `.grad` changes."""
    problems = {unsupported(layer.config) for layer in layers if hasattr(layer, "config")}
    if problems - {None}:
        raise ValueError(sorted(problems - {None})[0])
    device = torch.device("cuda", torch.cuda.current_device())
    samples = tuple(
        (torch.randn(sample_shape, device=device, dtype=dtype, requires_grad=True),) for _ in layers
    )
    torch.cuda.make_graphed_callables(tuple(layers), samples)
