"""FP8's loss curve against bf16's on a CPU: a small Llama from `mds_model` trained in bf16 and
with FP8 linears (`mds_model.fp8`, its pure-torch casts and `torch._scaled_mm` on the CPU: the
recipe and scaling state mds-train runs on a GPU, other GEMM kernels), from the same initial
weights on the same samples in the same order, for each seed.

A plain loop written here: fp32 master weights under the bf16 model (torch's AdamW, betas 0.9 /
0.95, weight decay 0.01 on every parameter, global-norm clipping at 1.0), linear warm-up over 3
iterations then a cosine to a tenth of --lr, the FP8 scaling updated after each step as mds-train
updates it. The samples are --seq-length-token windows of the first --tokens tokens of the
dataset, reshuffled every pass, so --tokens sets how many times the run reads its data (the 1B
runs of benchmarks/train.py read the shared corpus 1.8 times in 300 iterations).

Variants: bf16; fp8 (`--fp8-hybrid`: E4M3 forward, E5M2 gradients, amax history 1, most recent);
fp8-history (amax history 16, max); fp8-margin (margin 4: scales 16x below the largest, so
nothing saturates); fp8-bf16-wgrad (weight gradients in bf16). Prints, per seed and variant, the
relative difference of each 10-iteration mean loss from bf16's, and the final losses.

Usage: python benchmarks/fp8_curve_cpu.py --data-path PREFIX [--tokens 50000] [--iterations 300]
           [--seeds 1,2] [--variants bf16,fp8,fp8-history]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

RECIPES = {
    "fp8": {},
    "fp8-history": dict(amax_history_len=16, amax_compute_algo="max"),
    "fp8-margin": dict(margin=4),
    "fp8-bf16-wgrad": dict(fp8_wgrad=False),
}
WINDOW = 10  # iterations per mean


def train(args, variant: str, seed: int, tokens: torch.Tensor) -> list[float]:
    from mds_model import GPT, GPTConfig
    from mds_model.fp8 import Fp8Recipe, enable_fp8

    config = GPTConfig.preset(
        "llama",
        num_layers=args.layers,
        hidden_size=args.hidden,
        num_attention_heads=args.heads,
        num_query_groups=args.kv_heads,
        ffn_hidden_size=args.ffn,
        seq_length=args.seq_length,
        vocab_size=args.vocab,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=False,
        params_dtype="bfloat16",
        rotary_base=500000.0,
    )
    model = GPT(config, init_seed=seed)
    scaling = None
    if variant != "bf16":
        recipe = Fp8Recipe("hybrid", **RECIPES[variant])
        scaling = enable_fp8(model, recipe, use_kernel=False)
    params = list(model.parameters())
    masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    optimizer = torch.optim.AdamW(masters, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    samples = (len(tokens) - 1) // args.seq_length
    generator = torch.Generator().manual_seed(seed)
    passes = -(-args.iterations * args.micro_batch // samples)
    order = torch.cat([torch.randperm(samples, generator=generator) for _ in range(passes)])
    losses = []
    for step in range(args.iterations):
        cosine = 0.5 * (1 + math.cos(math.pi * step / args.iterations))
        lr = args.lr * min(1.0, (step + 1) / 3) * (0.1 + 0.9 * cosine)
        for group in optimizer.param_groups:
            group["lr"] = lr
        picked = order[step * args.micro_batch : (step + 1) * args.micro_batch].tolist()
        batch = torch.stack(
            [tokens[i * args.seq_length : (i + 1) * args.seq_length + 1] for i in picked]
        )
        loss = model(batch[:, :-1], batch[:, 1:]).mean()
        loss.backward()
        for param, master in zip(params, masters, strict=True):
            master.grad, param.grad = param.grad.float(), None
        torch.nn.utils.clip_grad_norm_(masters, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            for param, master in zip(params, masters, strict=True):
                param.copy_(master)
        if scaling is not None:
            scaling.update(iteration=step + 1, groups=[])
        losses.append(loss.item())
    return [float(np.mean(losses[i : i + WINDOW])) for i in range(0, len(losses), WINDOW)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-path", required=True, help="a .bin/.idx prefix")
    parser.add_argument("--tokens", type=int, default=50_000, help="train on the first N tokens")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--variants", default="bf16,fp8,fp8-history")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--ffn", type=int, default=704)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v != "bf16" and v not in RECIPES]
    if unknown or "bf16" not in variants:
        parser.error(f"--variants: give bf16 and any of {', '.join(RECIPES)}")
    from mds_indexed_data.reader import IndexedDatasetReader

    reader = IndexedDatasetReader(args.data_path)
    documents, count = [], 0
    for index in range(len(reader)):
        if count >= args.tokens:
            break
        documents.append(reader[index])
        count += len(documents[-1])
    head = np.concatenate(documents).astype(np.int64)[: args.tokens]
    if len(head) < args.tokens:
        parser.error(f"--tokens {args.tokens}: {args.data_path} has {len(head)}")
    tokens = torch.from_numpy(head)
    args.vocab = int(tokens.max()) + 1
    passes = args.iterations * args.micro_batch * args.seq_length / args.tokens
    print(
        f"{args.layers} layers, hidden {args.hidden}, {args.heads} heads ({args.kv_heads} "
        f"key/value), ffn {args.ffn}, seq {args.seq_length}, micro-batch {args.micro_batch}, "
        f"lr {args.lr:g}; {args.tokens:,} tokens read {passes:.1f} times in {args.iterations} "
        f"iterations; torch {torch.__version__}",
        flush=True,
    )
    for seed in (int(s) for s in args.seeds.split(",")):
        curves = {variant: train(args, variant, seed, tokens) for variant in variants}
        bf16 = curves["bf16"]
        print(f"seed {seed}: bf16 final {bf16[-1]:.4f}", flush=True)
        for variant, curve in curves.items():
            if variant == "bf16":
                continue
            differences = [
                (ours - theirs) / theirs for ours, theirs in zip(curve, bf16, strict=True)
            ]
            print(
                f"  {variant}: final {curve[-1]:.4f} ({differences[-1]:+.2%}); largest "
                f"{max(differences[1:] or differences, key=abs):+.2%}; every {WINDOW} iterations: "
                + " ".join(f"{d:+.1%}" for d in differences),
                flush=True,
            )


if __name__ == "__main__":
    main()
