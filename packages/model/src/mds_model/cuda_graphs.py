"""CUDA graphs over the transformer layers' forward and backward (Megatron-LM's
`--enable-cuda-graph`): each layer's training forward, and its backward, replay as one graph launch
instead of some fifty kernel launches issued by Python, so a slow or busy host no longer leaves the
GPU waiting (packages/train/README.md, "Profiling", measured where the host time went).

`torch.cuda.make_graphed_callables` captures every layer on a sample input of the micro-batch's
shape, sharing one memory pool; evaluation (`model.eval()`) runs the layers' own forward. A graph
replays its kernels on the buffers it captured: the caller keeps the shapes fixed and runs each
micro-batch's backward before the next forward, as a plain training loop does, and nothing in a
layer may need the host (activation recompute restores RNG states, TP's tracker swaps them):
`unsupported` says which setting is in the way.

Dropout replays fresh masks: torch registers the default CUDA generator with every capture, so
a replay draws at the generator's offset of the moment and advances it as the eager kernels
would. The capture's own warm-up passes and sample inputs draw nothing the run sees: the
generator's state is put back after them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .config import GPTConfig


def unsupported(config: GPTConfig, *, tensor_model_parallel_size: int) -> str | None:
    """Why the layers of `config` at this TP cannot be graphed, or None."""
    if config.activation_checkpointing != "none":
        return (
            "activation recompute restores RNG states inside the backward: drop "
            "--recompute-granularity and --checkpoint-activations"
        )
    if tensor_model_parallel_size > 1:
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
    `torch.autograd.grad`, so no parameter's `.grad` changes, and the CUDA generator's state is
    restored after them."""
    problems = {
        unsupported(layer.config, tensor_model_parallel_size=layer.groups.tp_size)
        for layer in layers
        if hasattr(layer, "config")
    }
    if problems - {None}:
        raise ValueError(sorted(problems - {None})[0])
    for layer in layers:
        _draw_attention_dropout_from_the_default_generator(layer)
    device = torch.device("cuda", torch.cuda.current_device())
    with torch.random.fork_rng(devices=[device]):
        samples = tuple(
            (torch.randn(sample_shape, device=device, dtype=dtype, requires_grad=True),)
            for _ in layers
        )
        torch.cuda.make_graphed_callables(tuple(layers), samples)


def _draw_attention_dropout_from_the_default_generator(layer: nn.Module) -> None:
    """At TP = 1 the model-parallel RNG state separates no ranks' heads, and swapping it in
    (`RNGStatesTracker.fork`, host-side get/set of generator states) cannot be captured: a graphed
    layer's attention dropout draws from the default generator, which the capture registers."""
    attention = getattr(layer, "self_attention", None)
    if attention is not None:
        attention.rng_tracker = None
