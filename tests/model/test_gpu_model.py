"""On the GPU (device machine): the model with Triton kernels equals the references."""

import pytest
import torch
from mds_model.config import GPTConfig
from mds_model.gpt import GPT, masked_mean
from mds_model.rng import model_parallel_seed

pytestmark = pytest.mark.gpu


def config(**overrides) -> GPTConfig:
    base = dict(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        vocab_size=1000,
        seq_length=200,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype="bfloat16",
    )
    base.update(overrides)
    return GPTConfig(**base)


def loss_and_grads(cfg: GPTConfig):
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (3, cfg.seq_length), generator=gen).cuda()
    labels = torch.randint(0, cfg.vocab_size, (3, cfg.seq_length), generator=gen).cuda()
    model = GPT(cfg, init_seed=1).cuda()
    loss = masked_mean(model(tokens, labels), None)
    loss.backward()
    return loss.item(), {n: p.grad.float() for n, p in model.named_parameters()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("position", ["learned", "alibi"])
def test_kernels_equal_references_in_the_model_bf16(position):
    ref_loss, ref_grads = loss_and_grads(
        config(position_embedding_type=position, use_fused_kernels=False)
    )
    loss, grads = loss_and_grads(config(position_embedding_type=position, use_fused_kernels=True))
    assert loss == pytest.approx(ref_loss, rel=1e-2)
    worst = max((rel(grads[n], g), n) for n, g in ref_grads.items())
    assert worst[0] < 3e-2, worst


def test_sdpa_backend_equals_explicit_softmax_bf16():
    sdpa_loss, sdpa_grads = loss_and_grads(config(attention_backend="sdpa"))
    soft_loss, soft_grads = loss_and_grads(config(attention_backend="softmax"))
    assert sdpa_loss == pytest.approx(soft_loss, rel=1e-2)
    worst = max((rel(sdpa_grads[n], g), n) for n, g in soft_grads.items())
    assert worst[0] < 3e-2, worst


def test_cudnn_backend_runs_cudnn_attention_and_equals_explicit_softmax_bf16():
    """SDPA takes cuDNN's fused attention when `cudnn` puts it first (its backward node says
    which kernel ran), and the loss and gradients equal the explicit-softmax oracle's within
    bf16's rounding, the tolerance of the sdpa test above."""
    cfg = config(attention_backend="cudnn", seq_length=256)
    attention = GPT(cfg, init_seed=1).cuda().layers[0].self_attention
    q, k, v = (
        torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    assert "Cudnn" in type(attention.attend(q, k, v).grad_fn).__name__
    cudnn_loss, cudnn_grads = loss_and_grads(cfg)
    soft_loss, soft_grads = loss_and_grads(config(attention_backend="softmax", seq_length=256))
    assert cudnn_loss == pytest.approx(soft_loss, rel=1e-2)
    worst = max((rel(cudnn_grads[n], g), n) for n, g in soft_grads.items())
    assert worst[0] < 3e-2, worst


def test_tracked_dropout_differs_per_tp_rank_on_cuda():
    torch.cuda.init()
    draws = []
    for tp_rank in (0, 1):
        tracker = model_parallel_seed(7, tp_rank=tp_rank)
        with tracker.fork():
            inside = torch.rand(8, device="cuda")
        draws.append((inside, torch.rand(8, device="cuda")))
    assert not torch.equal(draws[0][0], draws[1][0])
    assert torch.equal(draws[0][1], draws[1][1])
