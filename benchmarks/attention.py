"""Attention's core through each of SDPA's CUDA backends, and our model with `attention_backend`
`sdpa` (SDPA's own choice: on torch 2.11 on an H100 already cuDNN's kernels, as the trainer's
kernel profile showed in session 12) against `cudnn` (cuDNN's fused attention first), bf16,
causal, on one CUDA GPU.

For each shape (`--shapes`: 345m, 1.3b; micro-batch as benchmarks/train.py's) prints:
  op      forward+backward of `scaled_dot_product_attention` with one backend forced (flash, cudnn,
          efficient), q/k/v the strided views our attention makes (unbind and permute of the QKV
          projection's [S, B, heads, 3, head_dim]); its attention TFLOP/s (causal: half the
          scores); the largest difference of its output and input gradients from flash's
  model   mds_model's GPT forward+backward (no optimizer step), `sdpa` then `cudnn`, twice in
          alternation, on the same weights and tokens, and the loss of each
  graph   whether a layer with `cudnn` attention captures as a CUDA graph (mds_model.cuda_graphs)

    python3 benchmarks/attention.py [--shapes 345m,1.3b] [--repeats 20]
"""

from __future__ import annotations

import argparse
import sys

from cuda_timing import timed_ms

SHAPES = {  # name: (layers, hidden, heads, seq, micro-batch), as benchmarks/train.py's
    "345m": (24, 1024, 16, 1024, 16),
    "1.3b": (24, 2048, 16, 2048, 8),
}
OP_BACKENDS = ("flash", "cudnn", "efficient")


def bench_op(shape: tuple[int, ...], repeats: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    forced = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    _, hidden, heads, seq, batch = shape
    head_dim = hidden // heads
    qkv = torch.randn(seq, batch, heads, 3, head_dim, device="cuda", dtype=torch.bfloat16)
    qkv.requires_grad_()
    grad = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
    # causal: half the scores; forward 2 GEMMs, backward 5 (one recomputes the scores)
    flops = 2 * batch * heads * seq * seq * head_dim * 7 / 2
    results = {}
    for name in OP_BACKENDS:

        def step(backend=forced[name]):
            q, k, v = (t.permute(1, 2, 0, 3) for t in qkv.unbind(dim=3))
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(grad)
            return out

        try:
            ms = timed_ms(step, repeats)
        except RuntimeError as error:  # a backend that does not take this input
            print(f"  op {name:9s} not available: {str(error).splitlines()[0][:160]}")
            continue
        qkv.grad = None
        out = step()
        results[name] = (out.detach().float(), qkv.grad.float())
        qkv.grad = None
        line = f"  op {name:9s} forward+backward {ms:7.3f} ms, {flops / ms / 1e9:4.0f} TFLOP/s"
        if name != "flash" and "flash" in results:
            out_diff = (results[name][0] - results["flash"][0]).abs().max().item()
            grad_diff = (results[name][1] - results["flash"][1]).abs().max().item()
            line += f"; vs flash: output {out_diff:.1e}, gradients {grad_diff:.1e}"
        print(line, flush=True)


def bench_model(shape: tuple[int, ...], repeats: int) -> None:
    import torch
    from mds_model.config import GPTConfig
    from mds_model.cuda_graphs import graph_layers
    from mds_model.gpt import GPT, masked_mean

    layers, hidden, heads, seq, batch = shape
    base = dict(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        seq_length=seq,
        vocab_size=50257,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype="bfloat16",
    )
    models = {
        backend: GPT(GPTConfig(**base, attention_backend=backend), init_seed=0).cuda()
        for backend in ("sdpa", "cudnn")
    }
    generator = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, 50257, (batch, seq), device="cuda", generator=generator)
    labels = torch.randint(0, 50257, (batch, seq), device="cuda", generator=generator)
    for backend in ("sdpa", "cudnn", "sdpa", "cudnn"):
        model = models[backend]
        losses = []

        def step(model=model, losses=losses):
            loss = masked_mean(model(tokens, labels), None)
            loss.backward()
            losses.append(loss.detach())

        ms = timed_ms(step, repeats)
        model.zero_grad(set_to_none=True)
        print(
            f"  model {backend:5s} forward+backward {ms:7.1f} ms (loss {losses[0].item():.4f})",
            flush=True,
        )
    layer = models["cudnn"].layers[0]
    try:
        graph_layers([layer], sample_shape=(seq, batch, hidden), dtype=torch.bfloat16)
        print("  graph: a layer with cudnn attention captured as a CUDA graph", flush=True)
    except RuntimeError as error:
        print(f"  graph: capture failed: {str(error).splitlines()[0][:160]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="345m,1.3b", help="comma-separated: 345m, 1.3b")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per figure")
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    unknown = [name for name in shapes if name not in SHAPES]
    if unknown:
        parser.error(f"--shapes: unknown {', '.join(unknown)}; choose from {', '.join(SHAPES)}")
    import torch

    if not torch.cuda.is_available():
        sys.exit("attention.py: error: this benchmark needs a CUDA GPU; there is none here")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name in shapes:
        layers, hidden, heads, seq, batch = SHAPES[name]
        print(f"{name}: micro-batch {batch}, {heads} heads of {hidden // heads}, seq {seq}")
        bench_op(SHAPES[name], args.repeats)
        bench_model(SHAPES[name], max(args.repeats // 2, 1))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
