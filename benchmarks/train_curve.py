"""mds-train's loss curve on the seeds' 345M GPT in bf16 next to a plain PyTorch loop, same batches.

Runs `mds-train` for --iterations (bf16, Megatron's schedule) on a tokenized dataset, then a plain
loop written here on one GPU: the same GPT from `mds_model` with the same initial weights, kept in
fp32 and run under bf16 autocast, torch's fused AdamW with Megatron's parameter groups, the
schedule computed by hand, `clip_grad_norm_`, reading the same samples in the same order
(Megatron's sampler at DP = 1). Prints both curves every 25 iterations and the largest relative
difference of their 10-iteration means; the target is 2%.

Usage: python benchmarks/train_curve.py --data-path P --vocab-file V --merge-file M
           [--iterations 300]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPE = dict(num_layers=24, hidden_size=1024, num_attention_heads=16, seq_length=1024)
LR, MIN_LR, WARMUP, BETAS, WEIGHT_DECAY, SEED = 3e-4, 3e-5, 20, (0.9, 0.95), 0.1, 1234


def hand_lr(samples: int, *, global_batch: int, iterations: int) -> float:
    warmup, decay = WARMUP * global_batch, iterations * global_batch
    if samples <= warmup:
        return LR * samples / warmup
    ratio = (samples - warmup) / (decay - warmup)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (math.cos(math.pi * ratio) + 1)


def run_mds_train(args, out: Path) -> dict[int, float]:
    flags = [
        *("--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16"),
        *("--seq-length", "1024", "--micro-batch-size", str(args.micro_batch)),
        *("--global-batch-size", str(args.global_batch), "--train-iters", str(args.iterations)),
        *("--lr", str(LR), "--min-lr", str(MIN_LR), "--lr-decay-style", "cosine"),
        *("--lr-warmup-iters", str(WARMUP), "--weight-decay", str(WEIGHT_DECAY)),
        *("--adam-beta1", str(BETAS[0]), "--adam-beta2", str(BETAS[1]), "--clip-grad", "1.0"),
        *("--bf16", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", str(SEED)),
        *("--data-path", args.data_path, "--vocab-file", args.vocab_file),
        *("--merge-file", args.merge_file, "--split", "100,0,0", "--eval-iters", "0"),
        *("--log-interval", "1", "--output-dir", str(out), "--data-cache-path", str(out)),
    ]
    subprocess.run([sys.executable, "-m", "mds_train", *flags], check=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["iteration"]: r["lm_loss"] for r in records if r["event"] == "train"}


def run_plain_loop(args, cache: Path) -> dict[int, float]:
    import numpy as np
    import torch
    from mds_indexed_data import GPTDataConfig, build_train_valid_test_datasets
    from mds_model import GPT, GPTConfig, masked_mean

    torch.manual_seed(SEED)
    config = GPTConfig(
        **SHAPE, vocab_size=50257, hidden_dropout=0.0, attention_dropout=0.0, use_fused_kernels=True
    )
    model = GPT(config, init_seed=SEED).cuda()  # fp32 weights
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0}],
        lr=0.0,
        betas=BETAS,
        eps=1e-8,
        fused=True,
    )
    data = GPTDataConfig.from_data_path(
        [args.data_path],
        seq_length=SHAPE["seq_length"],
        num_samples=(args.iterations * args.global_batch, 0, 0),
        split="100,0,0",
        seed=SEED,
        cache_dir=str(cache),
    )
    train = build_train_valid_test_datasets(data).train
    losses, consumed, micro_steps = {}, 0, args.global_batch // args.micro_batch
    for iteration in range(1, args.iterations + 1):
        lr = hand_lr(consumed, global_batch=args.global_batch, iterations=args.iterations)
        for group in optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device="cuda")
        for micro in range(micro_steps):
            first = consumed + micro * args.micro_batch
            rows = [train[i] for i in range(first, first + args.micro_batch)]
            samples = torch.from_numpy(np.stack(rows)).cuda()
            tokens, labels = samples[:, :-1], samples[:, 1:]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = masked_mean(model(tokens, labels), None) / micro_steps
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        consumed += args.global_batch
        losses[iteration] = float(total)
    return losses


def windowed(losses: dict[int, float], width: int = 10) -> list[float]:
    values = [losses[i] for i in sorted(losses)]
    return [sum(values[i : i + width]) / width for i in range(0, len(values) - width + 1, width)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", required=True)
    parser.add_argument("--vocab-file", required=True)
    parser.add_argument("--merge-file", required=True)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        ours = run_mds_train(args, Path(work))
        plain = run_plain_loop(args, Path(work))
    for iteration in range(25, args.iterations + 1, 25):
        mine, theirs = ours[iteration], plain[iteration]
        print(f"iteration {iteration:4d}: mds-train {mine:.4f}  plain {theirs:.4f}")
    ours_mean, plain_mean = windowed(ours), windowed(plain)
    worst = max(abs(a - b) / b for a, b in zip(ours_mean, plain_mean, strict=True))
    print(
        f"10-iteration means over {args.iterations} iterations: largest relative difference "
        f"{worst:.2%} (target 2%); final mds-train {ours_mean[-1]:.4f}, plain {plain_mean[-1]:.4f}"
    )


if __name__ == "__main__":
    main()
