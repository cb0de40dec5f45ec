"""On the GPU (device machine): the Llama block (RMSNorm, SwiGLU, grouped-query attention, untied
head, no biases) with its Triton kernels equals the pure-torch references in bf16; each attention
backend takes grouped keys and values (flash-attn as they are, the others repeated) and agrees
with the explicit softmax; graphed layers equal eager ones; FP8 training steps follow bf16's; the
static-cache decoder follows the full forward."""

import copy

import pytest
import torch
from mds_model.config import GPTConfig
from mds_model.cuda_graphs import graph_layers
from mds_model.decoding import Decoder, StaticKVCache
from mds_model.fp8 import Fp8Recipe, enable_fp8
from mds_model.gpt import GPT, masked_mean

pytestmark = pytest.mark.gpu


def llama(**overrides) -> GPTConfig:
    base = dict(
        num_layers=2,
        hidden_size=256,
        num_attention_heads=8,
        num_query_groups=2,
        vocab_size=1000,
        seq_length=256,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype="bfloat16",
    )
    return GPTConfig.preset("llama", **{**base, **overrides})


def batch(cfg: GPTConfig, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (3, cfg.seq_length), generator=gen).cuda()
    labels = torch.randint(0, cfg.vocab_size, (3, cfg.seq_length), generator=gen).cuda()
    return tokens, labels


def loss_and_grads(cfg: GPTConfig):
    tokens, labels = batch(cfg)
    model = GPT(cfg, init_seed=1).cuda()
    loss = masked_mean(model(tokens, labels), None)
    loss.backward()
    return loss.item(), {n: p.grad.float() for n, p in model.named_parameters()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("groups", [2, None])
def test_llama_kernels_equal_references_bf16(groups):
    ref_loss, ref_grads = loss_and_grads(llama(num_query_groups=groups, use_fused_kernels=False))
    loss, grads = loss_and_grads(llama(num_query_groups=groups, use_fused_kernels=True))
    assert loss == pytest.approx(ref_loss, rel=1e-2)
    worst = max((rel(grads[n], g), n) for n, g in ref_grads.items())
    assert worst[0] < 3e-2, worst


@pytest.mark.parametrize("backend", ["flash", "sdpa", "cudnn"])
def test_grouped_attention_backends_equal_explicit_softmax_bf16(backend):
    from mds_model import attention

    if backend == "flash" and attention.flash_attn_func is None:
        pytest.skip("flash-attn is not installed on this machine")
    tokens, _ = batch(llama())
    reference = GPT(llama(attention_backend="softmax"), init_seed=2).cuda().eval()
    model = GPT(llama(attention_backend=backend), init_seed=2).cuda().eval()
    with torch.no_grad():
        expected = reference.logits(tokens).float()
        assert rel(model.logits(tokens).float(), expected) < 2e-2


def test_graphed_llama_layers_equal_eager_ones():
    cfg = llama()
    eager = GPT(cfg, init_seed=3).cuda().train()
    graphed = copy.deepcopy(eager)
    shape = (cfg.seq_length, 2, cfg.hidden_size)
    graph_layers(graphed.layers, sample_shape=shape, dtype=torch.bfloat16)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    outputs = []
    for stack in (eager.layers, graphed.layers):
        inputs = x.clone().requires_grad_()
        out = inputs
        for layer in stack:
            out = layer(out)
        out.float().square().mean().backward()
        outputs.append((out.detach().clone(), inputs.grad.clone()))
    (out_e, grad_e), (out_g, grad_g) = outputs
    assert rel(out_g.float(), out_e.float()) < 1e-2 and rel(grad_g.float(), grad_e.float()) < 1e-2
    for (name, p), q in zip(
        eager.layers.named_parameters(), graphed.layers.parameters(), strict=True
    ):
        assert rel(q.grad.float(), p.grad.float()) < 2e-2, name


def test_fp8_llama_steps_follow_bf16():
    """Two AdamW steps on one batch, the second in FP8 (the first calibrates): losses within 2%."""
    cfg = llama(use_fused_kernels=True)
    tokens, labels = batch(cfg, seed=4)
    losses = {}
    for name in ("bf16", "fp8"):
        model = GPT(cfg, init_seed=5).cuda()
        fp8 = enable_fp8(model, Fp8Recipe("hybrid"), use_kernel=True) if name == "fp8" else None
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        history = []
        for iteration in range(1, 4):
            loss = masked_mean(model(tokens, labels), None)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if fp8 is not None:
                fp8.update(iteration=iteration, groups=[])
            history.append(loss.item())
        losses[name] = history
    assert losses["fp8"] == pytest.approx(losses["bf16"], rel=2e-2), losses


def test_static_cache_decoding_follows_the_full_forward_bf16():
    cfg = llama(use_fused_kernels=True)
    model = GPT(cfg, init_seed=6).cuda().eval()
    tokens, _ = batch(cfg, seed=7)
    decoder = Decoder(model)
    with torch.no_grad():
        full = model.logits(tokens).float()
        cache = StaticKVCache(cfg, batch_size=3, max_length=cfg.seq_length, device="cuda")
        positions = torch.arange(cfg.seq_length, device="cuda").expand(3, -1)
        prefix = 200
        hidden = decoder.decode_static_hidden(
            tokens[:, :prefix], positions=positions[:, :prefix], cache=cache
        )
        steps = [decoder.lm_head(hidden)]
        for i in range(prefix, cfg.seq_length):
            hidden = decoder.decode_static_hidden(
                tokens[:, i : i + 1], positions=positions[:, i : i + 1], cache=cache
            )
            steps.append(decoder.lm_head(hidden))
        assert rel(torch.cat(steps, dim=1).float(), full) < 2e-2
