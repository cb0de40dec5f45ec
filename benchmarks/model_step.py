"""Full training step (forward + backward + AdamW) of the seeds' 345M GPT, ours vs reference_gpt.py.

Runs, each in its own process on one GPU, bf16: our GPT with the Triton kernels and with the
pure-torch references, eager and under torch.compile, then `reference_gpt.py` eager and --compile
(same shape: 24 layers, hidden 1024, 16 heads, seq 1024, vocab 50304, micro-batch 16), and prints
tokens/s, MFU (6N + 12Lhs FLOPs per token over a 790 TFLOP/s peak) and our/reference ratios.

Ours keeps bf16 weights with an fp32 master copy for a fused AdamW (DeepSpeed's bf16 mode); the
reference keeps fp32 weights under bf16 autocast with a fused AdamW. No dropout in either. The
`ours-*-fp32-autocast` variants run ours in the reference's scheme, so that their ratio to the
reference measures our implementation alone and the other variants' ratio adds the scheme's gain.
Usage: python benchmarks/model_step.py [--reference PATH] [--steps 20] [--mbs 16]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from cuda_timing import timed_ms

REPO = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCES = (
    REPO.parent / "shared" / "bench" / "reference_gpt.py",
    REPO / ".device" / "reference_gpt.py",
)
VARIANTS = {  # name: (use_fused_kernels, torch.compile, fp32 weights under bf16 autocast)
    "ours-eager-kernels": (True, False, False),
    "ours-compile-torch": (False, True, False),
    "ours-eager-torch": (False, False, False),
    "ours-compile-kernels": (True, True, False),
    "ours-eager-kernels-fp32-autocast": (True, False, True),
    "ours-compile-kernels-fp32-autocast": (True, True, True),
}


class MasterWeightAdamW:
    """bf16 model weights, fp32 master weights and moments: fused AdamW on masters, copy back."""

    def __init__(self, params, *, lr: float) -> None:
        import torch

        self.params = [p for p in params if p.requires_grad]
        self.master = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.master, lr=lr, fused=True)

    def step(self) -> None:
        import torch

        for master, param in zip(self.master, self.params, strict=True):
            master.grad = param.grad.float()
        self.optimizer.step()
        torch._foreach_copy_([p.data for p in self.params], self.master)

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None


def run_ours(variant: str, *, mbs: int, steps: int, peak: float, profile_dir: Path | None) -> dict:
    import torch
    from mds_model.config import GPTConfig
    from mds_model.estimate import total_parameters
    from mds_model.gpt import GPT, masked_mean

    use_kernels, compiled, autocast = VARIANTS[variant]
    config = GPTConfig(
        num_layers=24,
        hidden_size=1024,
        num_attention_heads=16,
        vocab_size=50257,
        seq_length=1024,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_fused_kernels=use_kernels,
        params_dtype="float32" if autocast else "bfloat16",
    )
    model = GPT(config, init_seed=0).cuda()
    n = model.num_parameters()
    assert n == total_parameters(config)
    if autocast:  # the reference's scheme: fp32 weights and AdamW, bf16 matmuls under autocast
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    else:
        optimizer = MasterWeightAdamW(model.parameters(), lr=1e-4)
    compiled_model = torch.compile(model) if compiled else model

    def forward(tokens, labels):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            return compiled_model(tokens, labels)

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(0, config.vocab_size, (mbs, config.seq_length), device="cuda", generator=gen)
    y = torch.randint(0, config.vocab_size, (mbs, config.seq_length), device="cuda", generator=gen)
    losses = []

    def one() -> None:
        loss = masked_mean(forward(x, y), None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())

    dt = timed_ms(one, steps) / 1e3
    trajectory = [round(loss.item(), 4) for loss in losses]  # same steps in every variant
    if profile_dir is not None:  # where the time goes, per CUDA kernel, over 3 more steps
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                one()
            torch.cuda.synchronize()
        table = prof.key_averages().table(
            sort_by="cuda_time_total", row_limit=25, max_name_column_width=70
        )
        (profile_dir / f"profile-{variant}.txt").write_text(table)
    tokens = mbs * config.seq_length
    flops_token = 6 * n + 12 * config.num_layers * config.hidden_size * config.seq_length
    return {
        "variant": variant,
        "params": n,
        "step_ms": dt * 1e3,
        "tokens_per_s": tokens / dt,
        "mfu": flops_token * tokens / dt / peak,
        "losses": trajectory,
        "max_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def run_reference(path: Path, *, compiled: bool, mbs: int, steps: int) -> dict:
    cmd = [sys.executable, str(path), "--mbs", str(mbs), "--steps", str(steps)] + (
        ["--compile"] if compiled else []
    )
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    match = re.search(r"step=([\d.]+)ms tok/s=([\d,]+) .*MFU=([\d.]+)%", line)
    if proc.returncode or not match:
        return {
            "variant": f"reference-{'compile' if compiled else 'eager'}",
            "error": proc.stderr[-800:],
        }
    return {
        "variant": f"reference-{'compile' if compiled else 'eager'}",
        "step_ms": float(match[1]),
        "tokens_per_s": float(match[2].replace(",", "")),
        "mfu": float(match[3]) / 100,
        "line": line,
    }


def child(variant: str, *, mbs: int, steps: int, peak: float, profile_dir: Path | None) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--variant",
        variant,
        "--mbs",
        str(mbs),
        "--steps",
        str(steps),
        "--peak",
        str(peak),
    ] + (["--profile-dir", str(profile_dir)] if profile_dir else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        return {"variant": variant, "error": (proc.stdout + proc.stderr)[-1500:]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference", type=Path, default=None, help="reference_gpt.py to compare with"
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps after 3 warm-up steps")
    parser.add_argument("--mbs", type=int, default=16, help="micro-batch size")
    parser.add_argument("--peak", type=float, default=790e12, help="peak bf16 FLOP/s for MFU")
    parser.add_argument(
        "--variant", choices=sorted(VARIANTS), help="(internal) run one variant of ours"
    )
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated variants of ours"
    )
    parser.add_argument("--json-out", type=Path, default=None, help="also write all results here")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        help="write a per-kernel CUDA time table of each eager variant of ours here",
    )
    args = parser.parse_args()
    if args.variant:
        profile_dir = args.profile_dir if args.variant.startswith("ours-eager") else None
        result = run_ours(
            args.variant, mbs=args.mbs, steps=args.steps, peak=args.peak, profile_dir=profile_dir
        )
        print(json.dumps(result), flush=True)
        return
    reference = args.reference or next((p for p in DEFAULT_REFERENCES if p.is_file()), None)
    if reference is None or not reference.is_file():
        sys.exit(
            f"model_step: reference_gpt.py not found (tried {args.reference or DEFAULT_REFERENCES})"
            "; pass --reference PATH"
        )
    results = []
    for compiled in (False, True):
        results.append(run_reference(reference, compiled=compiled, mbs=args.mbs, steps=args.steps))
        print(json.dumps(results[-1]), flush=True)
    for variant in args.variants.split(","):
        results.append(
            child(
                variant,
                mbs=args.mbs,
                steps=args.steps,
                peak=args.peak,
                profile_dir=args.profile_dir,
            )
        )
        print(json.dumps(results[-1]), flush=True)
    by_name = {r["variant"]: r for r in results}
    eager, comp = by_name["reference-eager"], by_name["reference-compile"]
    trajectories = {r["variant"]: r["losses"] for r in results if "losses" in r}
    if trajectories:  # the same model, data and seed: the variants differ only in rounding
        print("\nloss at steps 1, 2, 4, 8, 16, 23 (3 warm-up + timed steps):")
        for name, losses in trajectories.items():
            picks = [losses[i] for i in (0, 1, 3, 7, 15, len(losses) - 1) if i < len(losses)]
            print(f"  {name:<22}" + " ".join(f"{x:8.4f}" for x in picks))
    print(f"\n345M step, micro-batch {args.mbs}, seq 1024, bf16, {args.steps} timed steps")
    print(
        f"{'variant':<22}{'step ms':>9}{'tokens/s':>11}{'MFU':>7}{'vs eager':>10}{'vs compile':>11}"
    )
    for r in results:
        if "error" in r:
            last_line = r["error"].strip().splitlines()[-1] if r["error"].strip() else "?"
            print(f"{r['variant']:<22} failed: {last_line}")
            continue
        ratio_e = (
            r["tokens_per_s"] / eager["tokens_per_s"] if "tokens_per_s" in eager else float("nan")
        )
        ratio_c = (
            r["tokens_per_s"] / comp["tokens_per_s"] if "tokens_per_s" in comp else float("nan")
        )
        print(
            f"{r['variant']:<22}{r['step_ms']:9.1f}{r['tokens_per_s']:11,.0f}{r['mfu']:7.1%}"
            f"{ratio_e:10.3f}{ratio_c:11.3f}"
        )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
