"""CUDA graphs over the transformer layers' forward and backward (Megatron-LM's
`--enable-cuda-graph`): each layer's training forward, and its backward, replay as one graph launch
instead of some fifty kernel launches issued by Python, so a slow or busy host no longer leaves the
GPU waiting (packages/train/README.md, "Profiling", measured where the host time went).

The layers are captured as one chain (torch's `make_graphed_callables`, with the layers' buffers
linked): every layer on the previous layer's output buffer and every backward on the next layer's
input-gradient buffer, all in one memory pool in the order they replay, so a replay reads its
input where the previous one wrote it instead of copying it into a buffer of its own (two copies
of the hidden states per layer and step: 4.9 ms of a Llama 3B step at micro-batch 15, and a
buffer each). Evaluation (`model.eval()`) runs the layers' own forward. A graph replays its kernels
on the buffers it captured: the caller keeps the shapes fixed and runs each micro-batch's backward
before the next forward, as a plain training loop does, and nothing in a layer may need the host
(activation recompute restores RNG states, TP's tracker swaps them): `unsupported` says which
setting is in the way.

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
    as a chain on a random input of `sample_shape` (S, B, H) in `dtype` on the current CUDA
    device. Warm-up passes run first, as make_graphed_callables' do; they compute gradients with
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
        if not layer.training:
            raise ValueError("CUDA graphs capture the training forward: call .train() first")
        # A forward pre-hook runs at each call, before the replay and outside the graphs (ZeRO's
        # wait for the layer's gathered weights); the captures call `forward` itself.
        if layer._forward_hooks or layer._backward_hooks:
            raise ValueError(
                "CUDA graphs: a layer has forward or backward hooks, which a replay would skip"
            )
        _draw_attention_dropout_from_the_default_generator(layer)
    device = torch.device("cuda", torch.cuda.current_device())
    with torch.random.fork_rng(devices=[device]):
        sample = torch.randn(sample_shape, device=device, dtype=dtype, requires_grad=True)
        chain = [
            _LayerGraphs(tuple(p for p in layer.parameters() if p.requires_grad))
            for layer in layers
        ]
        _warm_up(layers, chain, sample)
        _capture_chain(layers, chain, sample)
    for layer, graphs in zip(layers, chain, strict=True):
        layer.forward = _graphed_forward(layer, graphs)


class _LayerGraphs:
    """One layer's captured forward and backward and the buffers they read and write: `input`
    is the previous layer's `output` (the first layer's its own), `grad_output` the next layer's
    `grad_input` (the last layer's its own)."""

    def __init__(self, params: tuple[nn.Parameter, ...]) -> None:
        self.params = params
        self.forward, self.backward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        self.input = self.output = self.grad_output = None
        self.grad_input, self.grad_params = None, ()


def _warm_up(
    layers: Sequence[nn.Module],
    chain: list[_LayerGraphs],
    sample: torch.Tensor,
    *,
    passes: int = 3,
) -> None:
    """Eager passes on a side stream before any capture (make_graphed_callables' three), so
    cuDNN's and Triton's first-call work and lazy allocations stay out of the graphs."""
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        for layer, graphs in zip(layers, chain, strict=True):
            for _ in range(passes):
                out = layer.forward(sample)
                torch.autograd.grad(out, (sample, *graphs.params), torch.empty_like(out))
            del out
    torch.cuda.synchronize()


def _capture_chain(
    layers: Sequence[nn.Module], chain: list[_LayerGraphs], sample: torch.Tensor
) -> None:
    """Fills `chain`: forwards captured first to last, each on the previous one's output, then
    backwards last to first, each on the next one's input gradient: the order they replay in, so
    the one pool's reuse of freed memory between captures is safe at replay."""
    pool = torch.cuda.graph_pool_handle()
    x = sample
    for layer, graphs in zip(layers, chain, strict=True):
        graphs.input = x
        with torch.cuda.graph(graphs.forward, pool=pool):
            graphs.output = layer.forward(x)
        x = graphs.output.detach().requires_grad_()
    grad = torch.empty_like(x)
    for graphs in reversed(chain):
        graphs.grad_output = grad
        with torch.cuda.graph(graphs.backward, pool=pool):
            grads = torch.autograd.grad(
                graphs.output, (graphs.input, *graphs.params), graphs.grad_output
            )
        graphs.grad_input, graphs.grad_params = grads[0], grads[1:]
        grad = graphs.grad_input


class _GraphedLayer(torch.autograd.Function):
    """A layer as its two graphs: the input and output gradient are copied in only where they
    are not already in the captured buffer (the first layer's input, the last one's gradient)."""

    @staticmethod
    def forward(ctx, graphs: _LayerGraphs, x: torch.Tensor, *params: torch.Tensor):
        if x.data_ptr() != graphs.input.data_ptr():
            graphs.input.copy_(x)
        graphs.forward.replay()
        ctx.graphs = graphs
        return graphs.output.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        graphs = ctx.graphs
        if grad.data_ptr() != graphs.grad_output.data_ptr():
            graphs.grad_output.copy_(grad)
        graphs.backward.replay()
        return None, graphs.grad_input.detach(), *(g.detach() for g in graphs.grad_params)


def _graphed_forward(layer: nn.Module, graphs: _LayerGraphs):
    """The layer's forward: graph replays in training, its own forward in evaluation."""
    eager = layer.forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        if not layer.training:
            return eager(x)
        return _GraphedLayer.apply(graphs, x, *graphs.params)

    return forward


def _draw_attention_dropout_from_the_default_generator(layer: nn.Module) -> None:
    """At TP = 1 the model-parallel RNG state separates no ranks' heads, and swapping it in
    (`RNGStatesTracker.fork`, host-side get/set of generator states) cannot be captured: a graphed
    layer's attention dropout draws from the default generator, which the capture registers."""
    attention = getattr(layer, "self_attention", None)
    if attention is not None:
        attention.rng_tracker = None
