"""The optimizer's part of a bf16 training step on one GPU: MasterWeightAdamW's Triton step against
its torch path, over the parameters of the 345M or 1.3B GPT (the trainer's two groups).

Both start from the bf16 gradients backward leaves and end with new bf16 weights, clipping
included (the fp32 norm of the gradients, then the coefficient applied inside the step):
- torch: the gradients cast to fp32 (one foreach copy), torch's fused AdamW over the fp32 masters
  (grad_scale), the bf16 weights refreshed from the masters (one foreach copy);
- kernel: one Triton launch per group reads the bf16 gradients and writes masters, moments and
  the bf16 weights.
Prints ms per step for each (CUDA-synchronised loop, benchmarks/cuda_timing.py), the bytes of
memory traffic per parameter each implies over the copy bandwidth, and torch's time over the
kernel's. Usage: python benchmarks/optimizer_step.py [--shape 345m|1.3b] [--repeats 20]
"""

from __future__ import annotations

import argparse

from cuda_timing import timed_ms
from train import SHAPES  # benchmarks/train.py's model shapes

# Memory traffic per parameter (bf16 weights and gradients, fp32 masters and moments):
# torch: cast 2+4, AdamW 4 (grad) + 3x(4+4), refresh 4+2; kernel: 2 + 3x(4+4) + 2; norm reads 4 / 2.
BYTES_PER_PARAMETER = {"torch": 6 + 28 + 6 + 4, "kernel": 28 + 2}


def build(shape: dict, *, use_kernel: bool):
    import torch
    from mds_model.config import GPTConfig
    from mds_model.gpt import GPT
    from mds_train.gradients import clip_coefficient, norm_of
    from mds_train.master_weights import MasterWeightAdamW
    from mds_train.model_setup import parameter_groups

    config = GPTConfig(vocab_size=50257, params_dtype="bfloat16", **shape)
    with torch.device("meta"):
        model = GPT(config)
    model = model.to_empty(device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for param in model.parameters():
        param.data.normal_(0.0, 0.02, generator=generator)
        param.grad = torch.randn(param.shape, device="cuda", generator=generator).bfloat16()
    optimizer = MasterWeightAdamW(
        parameter_groups(model, 0.1, config=config),
        betas=(0.9, 0.95),
        eps=1e-8,
        use_kernel=use_kernel,
    )
    for group in optimizer.param_groups:
        group["lr"] = 1e-4

    def step() -> None:
        grads = [grad for _, grad in optimizer.master_gradients()]
        optimizer.scale_gradients(clip_coefficient(norm_of(grads, None), 1.0))
        optimizer.step()  # gradients kept (no zero_grad): every step reads the same ones

    num_params = sum(p.numel() for p in model.parameters())
    return step, num_params


def copy_bandwidth_gbs(num_bytes: int, repeats: int) -> float:
    import torch

    source = torch.empty(num_bytes // 2, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    ms = timed_ms(lambda: target.copy_(source), repeats)
    return 2 * source.numel() / ms / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="345m", help="model shape")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per path")
    args = parser.parse_args()
    import torch

    results = {}
    for name, use_kernel in (("torch", False), ("kernel", True)):
        step, num_params = build(SHAPES[args.shape], use_kernel=use_kernel)
        results[name] = timed_ms(step, args.repeats)
        del step
        torch.cuda.empty_cache()
    bandwidth = copy_bandwidth_gbs(1 << 30, args.repeats)
    print(f"{args.shape}: {num_params / 1e6:.1f}M parameters; copy {bandwidth:.0f} GB/s")
    for name, ms in results.items():
        traffic = BYTES_PER_PARAMETER[name] * num_params / 1e6
        print(
            f"  {name:6s} {ms:7.2f} ms  {BYTES_PER_PARAMETER[name]} B/param  "
            f"{traffic / ms:.0f} GB/s ({100 * traffic / ms / bandwidth:.0f}% of copy)"
        )
    print(f"  torch / kernel: {results['torch'] / results['kernel']:.3f}x")


if __name__ == "__main__":
    main()
