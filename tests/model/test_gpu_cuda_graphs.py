"""On the GPU (device machine): graphed layers (mds_model.cuda_graphs) replay dropout with fresh
masks drawn where the eager layers would draw them, so a graphed layer with dropout computes what
the eager one computes from the same generator state, call after call."""

import pytest
import torch
from mds_model.config import GPTConfig
from mds_model.cuda_graphs import graph_layers
from mds_model.gpt import GPT
from mds_model.rng import model_parallel_seed
from torch.utils._python_dispatch import TorchDispatchMode

pytestmark = pytest.mark.gpu

SHAPE = (64, 4, 128)  # (S, B, H)


def layers(tracker) -> torch.nn.ModuleList:
    config = GPTConfig(
        num_layers=2,
        hidden_size=SHAPE[2],
        num_attention_heads=4,
        vocab_size=1000,
        seq_length=SHAPE[0],
        hidden_dropout=0.1,
        attention_dropout=0.1,
        params_dtype="bfloat16",
    )
    return GPT(config, init_seed=3, rng_tracker=tracker).cuda().train().layers


def forward_backward(stack, x: torch.Tensor, seed: int):
    torch.cuda.manual_seed(seed)
    x = x.detach().clone().requires_grad_()
    out = x
    for layer in stack:
        out = layer(out)
    out.float().square().mean().backward()
    grads = [p.grad.clone() for p in stack.parameters()]
    stack.zero_grad(set_to_none=True)
    # A graph's outputs are its static buffers, which the next replay overwrites: copies.
    return out.detach().clone(), x.grad.clone(), grads


def test_graphed_dropout_draws_what_eager_draws_and_fresh_masks_each_replay():
    x = torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16)
    # Without a model-parallel tracker the eager attention dropout draws from the default
    # generator too, which is what a graphed layer does at TP = 1.
    eager = layers(None)
    graphed = layers(model_parallel_seed(5))
    state = torch.cuda.get_rng_state()
    graph_layers(graphed, sample_shape=SHAPE, dtype=torch.bfloat16)
    assert torch.equal(torch.cuda.get_rng_state(), state)  # the capture drew nothing we see
    for seed in (11, 12):
        want, ours = forward_backward(eager, x, seed), forward_backward(graphed, x, seed)
        torch.testing.assert_close(ours[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(ours[1], want[1], rtol=0, atol=0)
        for mine, theirs in zip(ours[2], want[2], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    # Two replays from one generator: the second draws new masks.
    torch.cuda.manual_seed(11)
    first = graphed[0](x.clone().requires_grad_()).detach().clone()
    second = graphed[0](x.clone().requires_grad_()).detach()
    assert not torch.equal(first, second)
    # And the generator advanced by what the eager layer's two calls advance it.
    after_graphed = torch.cuda.get_rng_state()
    torch.cuda.manual_seed(11)
    eager[0](x.clone().requires_grad_())
    eager[0](x.clone().requires_grad_())
    assert torch.equal(torch.cuda.get_rng_state(), after_graphed)


class CopyCounter(TorchDispatchMode):
    """Counts aten.copy_ calls (a graph replay itself issues none: only its input copies)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func is torch.ops.aten.copy_.default
        return func(*args, **(kwargs or {}))


def test_chained_layers_read_their_input_where_the_previous_graph_wrote_it():
    """Three graphed layers: the first layer's input and the last one's output gradient are
    copied into the captured buffers, and nothing between the layers (torch's
    make_graphed_callables copies both at every layer)."""
    stack = torch.nn.ModuleList([*layers(model_parallel_seed(5)), *layers(model_parallel_seed(6))])
    graph_layers(stack[:3], sample_shape=SHAPE, dtype=torch.bfloat16)
    x = torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16)
    with CopyCounter() as forward:
        out = x
        for layer in stack[:3]:
            out = layer(out)
    with CopyCounter() as backward:
        out.backward(grad)
        torch.cuda.synchronize()
    assert forward.count == 1
    assert backward.count == 1
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)
