"""On the GPU (device machine): the Llama block (RMSNorm, SwiGLU, grouped-query attention, untied
head, no biases) with its Triton kernels equals the pure-torch references in bf16; each attention
backend takes grouped keys and values (flash-attn as they are, the others repeated) and agrees
with the explicit softmax; graphed layers equal eager ones; FP8 training steps follow bf16's; the
static-cache decoder follows the full forward, its one-row step (the skinny kernels: add + RMSNorm
+ QKV product, SwiGLU epilogue, rotary split into the cache) too, and that step captured in a CUDA
graph replays the eager step's logits."""

import copy

import pytest
import torch
from mds_model import kernels
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


def one_row_steps(decoder: Decoder, tokens, cache: StaticKVCache, *, prefix: int):
    """Logits of a one-row prefill of tokens[:, :prefix], then of one token per step."""
    positions = torch.arange(tokens.shape[1], device="cuda")[None]
    hidden = decoder.decode_static_hidden(
        tokens[:, :prefix], positions=positions[:, :prefix], cache=cache
    )
    steps = [decoder.lm_head(hidden)]
    for i in range(prefix, tokens.shape[1]):
        hidden = decoder.decode_static_hidden(
            tokens[:, i : i + 1], positions=positions[:, i : i + 1], cache=cache
        )
        steps.append(decoder.lm_head(hidden))
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_query_groups": 1},
        {"num_query_groups": None},
        {"untie_embeddings_and_output_weights": False},
        {"attention_backend": "softmax"},
    ],
    ids=["gqa", "mqa", "mha", "tied", "softmax"],
)
def test_one_row_fused_step_follows_the_full_forward_bf16(overrides, monkeypatch):
    """Batch 1: every projection of a step runs the skinny kernels (counted), and the logits
    follow the full forward within bf16's rounding."""
    calls = {"skinny_linear": 0, "skinny_add_norm_linear": 0}
    for name in calls:
        original = getattr(kernels, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(kernels, name, counted)
    cfg = llama(use_fused_kernels=True, **overrides)
    model = GPT(cfg, init_seed=8).cuda().eval()
    tokens = batch(cfg, seed=9)[0][:1]
    prefix = 192
    with torch.no_grad():
        full = model.logits(tokens).float()
        cache = StaticKVCache(cfg, batch_size=1, max_length=cfg.seq_length, device="cuda")
        got = one_row_steps(Decoder(model), tokens, cache, prefix=prefix).float()
    steps = cfg.seq_length - prefix
    # 2 layers (the first's QKV product after its own norm) and the head
    per_step = {"skinny_linear": 6, "skinny_add_norm_linear": 3}
    assert calls == {name: count * steps for name, count in per_step.items()}
    assert rel(got, full) < 2e-2


def test_one_row_step_in_a_cuda_graph_replays_the_eager_step_bf16():
    """mds-generate's capture (warm-up on a side stream, then the graph over static token and
    position buffers): each replay's logits equal an eager step's on a second cache."""
    cfg = llama(use_fused_kernels=True)
    model = GPT(cfg, init_seed=10).cuda().eval()
    tokens = batch(cfg, seed=11)[0][:1]
    decoder, prefix = Decoder(model), 128
    caches = [
        StaticKVCache(cfg, batch_size=1, max_length=cfg.seq_length, device="cuda") for _ in range(2)
    ]
    positions = torch.arange(cfg.seq_length, device="cuda")[None]
    token = tokens[:, prefix : prefix + 1].clone()
    position = positions[:, prefix : prefix + 1].clone()

    def step(cache: StaticKVCache) -> torch.Tensor:
        hidden = decoder.decode_static_hidden(token, positions=position, cache=cache)
        return decoder.lm_head(hidden)

    with torch.no_grad():
        for cache in caches:
            decoder.decode_static_hidden(
                tokens[:, :prefix], positions=positions[:, :prefix], cache=cache
            )
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # Triton compiles here; the step's own slot is written again
                step(caches[1])
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graphed = step(caches[1])
        replayed, eager = [], []
        for i in range(prefix, cfg.seq_length):
            token.copy_(tokens[:, i : i + 1])
            position.copy_(positions[:, i : i + 1])
            graph.replay()
            replayed.append(graphed.clone())
            eager.append(step(caches[0]))
        replayed, eager = torch.cat(replayed, dim=1), torch.cat(eager, dim=1)
        assert torch.equal(caches[1].layers[0].kv, caches[0].layers[0].kv)
        assert rel(replayed.float(), eager.float()) < 1e-3
        full = model.logits(tokens).float()[:, prefix:]
        assert rel(replayed.float(), full) < 2e-2
