"""Greedy generation speed: mds-generate's Generator vs transformers' `generate`, same weights,
same process.

A random GPT (default: the seeds' 345M GPT-2, 24 layers, hidden 1024, 16 heads, vocab 50257) is
built in mds_model, exported to a `GPT2LMHeadModel` (mds_model.hf), and both generate 256 new
tokens after a 32-token random prompt at batch 1 and 8 (greedy, end-of-document ignored, as the
issue's probe: `min_new_tokens` for transformers). Prints new tokens/s, our/transformers ratio,
time to first token (a whole call with one new token), how many greedy tokens agree, and the
fraction of the weight-bandwidth bound: batch x (copy bandwidth measured here) / (bytes of the
weights read per step).
Variants of ours: CUDA graphs over the eager step (the default on CUDA), torch.compile of the
step under CUDA graphs, and plain eager launches; on CPU eager (the default) and compile (the
step's layers compiled, the LM head eager; its compilation is in "first call").
Usage: python benchmarks/generate.py [--device cuda|cpu] [--dtype bfloat16] [--small]
       [--variants graphs,compile,eager] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time

import torch


def measured_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device copy (read + write)."""
    size = (1 << 30) if device.type == "cuda" else (1 << 28)
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    best = float("inf")
    for _ in range(5):
        sync(device)
        start = time.perf_counter()
        target.copy_(source)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size / best


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(device, functions, repeats: int):
    """Each function's best of `repeats` calls after one warm-up call, the calls interleaved (a
    busy machine slows both alike): [(seconds, last result)] in order."""
    results = [function() for function in functions]
    best = [float("inf")] * len(functions)
    for _ in range(repeats):
        for index, function in enumerate(functions):
            sync(device)
            start = time.perf_counter()
            results[index] = function()
            sync(device)
            best[index] = min(best[index], time.perf_counter() - start)
    return list(zip(best, results, strict=True))


def build_models(args, device: torch.device, dtype: torch.dtype):
    import transformers
    from mds_generate.loading import inference_config
    from mds_model import GPT, GPTConfig, hf_gpt2_config, to_hf_gpt2_state_dict

    config = GPTConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        vocab_size=args.vocab_size,
        seq_length=1024,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    config = inference_config(config, dtype=args.dtype, device=device)
    ours = GPT(config, init_seed=1234)
    hf_config = transformers.GPT2Config(**hf_gpt2_config(config, eos_token_id=args.vocab_size - 1))
    theirs = transformers.GPT2LMHeadModel(hf_config)
    missing, unexpected = theirs.load_state_dict(
        to_hf_gpt2_state_dict(ours.state_dict(), config), strict=False
    )
    assert not unexpected and all(name == "lm_head.weight" for name in missing), missing
    theirs.tie_weights()
    ours = ours.to(device).eval()
    theirs = theirs.to(device, dtype).eval()
    return config, ours, theirs


def _agreeing(theirs: list[int], ours) -> int:
    """How many leading tokens two greedy runs share."""
    for index, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        if a != b:
            return index
    return len(theirs)


class RandomTokenizer:
    """What the Generator needs of a tokenizer, for random ids (nothing is decoded)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self.eod = vocab_size, vocab_size - 1

    def decode(self, ids) -> str:
        return ""


VARIANTS = {  # name: (CUDA graphs, torch.compile of the one-token step)
    "graphs": (True, False),
    "graphs-cublas": (True, False),  # one-row products by cuBLAS instead of skinny_linear
    "compile": (True, True),
    "eager": (False, False),
}


@contextlib.contextmanager
def cublas_projections(variant: str):
    """For graphs-cublas: decoding's one-row products go to F.linear while the step is captured
    (the graph then replays cuBLAS's kernels)."""
    import mds_model.kernels

    if variant != "graphs-cublas":
        yield
        return
    skinny = mds_model.kernels.skinny_linear

    def cublas(x, weight, bias=None, *, gelu=False, use_kernel):
        if not gelu:
            return torch.nn.functional.linear(x, weight, bias)
        return mds_model.kernels.bias_gelu(x @ weight.t(), bias, use_kernel=True)

    mds_model.kernels.skinny_linear = cublas
    try:
        yield
    finally:
        mds_model.kernels.skinny_linear = skinny


def ours_model(model, config, variant: str, device):
    """torch.compile traces the pure-torch ops (the Triton kernels are opaque to it)."""
    from mds_model import GPT

    if not VARIANTS[variant][1] or not config.use_fused_kernels:
        return model
    plain = GPT(dataclasses.replace(config, use_fused_kernels=False), init_seed=None)
    plain.load_state_dict(model.state_dict())
    return plain.to(device).eval()


def profile_steps(generator, sampler, prompts, device, new: int) -> None:
    """Per-kernel GPU time of a generate call (graph replays included), top 12 by time."""
    from mds_generate import GenerationConfig
    from torch.profiler import ProfilerActivity, profile

    generation = GenerationConfig(max_new_tokens=new, stop_at_eod=False)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        generator.generate(prompts, sampler=sampler, generation=generation)
        sync(device)
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in events)
    count = sum(e.count for e in events)
    print(f"  profile: {count / new:.0f} kernels and {total / new:.0f} us of kernel time per step")
    for event in events[:12]:
        print(
            f"  {event.self_device_time_total / new:8.1f} us/step {event.count / new:6.1f}x "
            f"{event.key[:90]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--small", action="store_true", help="4 layers, hidden 256 (CPU)")
    parser.add_argument("--num-layers", type=int, default=24)
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--num-attention-heads", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls (best kept)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's)")
    parser.add_argument(
        "--variants",
        default=None,
        help=f"ours, comma-separated: {', '.join(VARIANTS)} (default: graphs on CUDA; "
        "CPU: eager and compile only, default eager)",
    )
    parser.add_argument("--profile", action="store_true", help="kernel times of each variant")
    args = parser.parse_args()
    if args.small:
        args.num_layers, args.hidden_size, args.num_attention_heads = 4, 256, 4
    device = torch.device(args.device)
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = (args.variants or ("graphs" if device.type == "cuda" else "eager")).split(",")
    if device.type == "cpu" and not set(variants) <= {"eager", "compile"}:
        parser.error("--variants on CPU: eager and/or compile")

    import transformers
    from mds_generate import GenerationConfig, Generator, Sampler, SamplingConfig

    torch.manual_seed(0)
    config, ours, theirs = build_models(args, device, dtype)
    weight_bytes = sum(
        p.numel() * p.element_size()
        for name, p in ours.named_parameters()
        if name != "embedding.position_embeddings.weight"  # one row per step
    )
    bandwidth = measured_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{name}, {args.dtype}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, threads {torch.get_num_threads()}; "
        f"{args.num_layers} layers, hidden {args.hidden_size}, vocab {args.vocab_size}: "
        f"{weight_bytes / 1e9:.3f} GB of weights per step; copy bandwidth "
        f"{bandwidth / 1e9:,.0f} GB/s -> bound {bandwidth / weight_bytes:,.0f} steps/s",
        flush=True,
    )
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=args.vocab_size, device=device)
    generators = {}
    for variant in variants:
        cuda_graphs, compiled = VARIANTS[variant]
        generators[variant] = Generator(
            ours_model(ours, config, variant, device),
            RandomTokenizer(args.vocab_size),
            device=device,
            cuda_graphs=cuda_graphs,
            compile=compiled,
        )

    def run_ours(generator, prompts, new_tokens):
        generation = GenerationConfig(max_new_tokens=new_tokens, stop_at_eod=False)
        return generator.generate(prompts, sampler=sampler, generation=generation)

    def run_theirs(ids, new_tokens):
        with torch.inference_mode():
            return theirs.generate(
                ids,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )

    print(
        f"{'batch':>5} | {'ours':>7} | {'transformers tok/s':>18} | {'ours tok/s':>10} | "
        f"{'ratio':>6} | {'of bound':>8} | {'TTFT transformers':>17} | {'TTFT ours':>9} | "
        "greedy tokens equal (per row)",
        flush=True,
    )
    for batch in args.batch_sizes:
        ids = torch.randint(0, args.vocab_size - 1, (batch, args.prompt_length), device=device)
        prompts, new = ids.tolist(), args.new_tokens
        for variant, generator in generators.items():
            start = time.perf_counter()
            with cublas_projections(variant):
                run_ours(generator, prompts, new)  # compiles and captures outside the timing
            setup = time.perf_counter() - start
            (theirs_s, theirs_out), (ours_s, ours_out) = timed(
                device,
                [lambda: run_theirs(ids, new), lambda: run_ours(generator, prompts, new)],  # noqa: B023
                args.repeats,
            )
            (theirs_first, _), (ours_first, _) = timed(
                device,
                [lambda: run_theirs(ids, 1), lambda: run_ours(generator, prompts, 1)],  # noqa: B023
                args.repeats,
            )
            agree = [
                _agreeing(row, completion.token_ids)
                for row, completion in zip(
                    theirs_out[:, args.prompt_length :].tolist(), ours_out, strict=True
                )
            ]
            theirs_rate, ours_rate = batch * new / theirs_s, batch * new / ours_s
            bound = batch * bandwidth / weight_bytes
            print(
                f"{batch:>5} | {variant:>7} | {theirs_rate:>18,.0f} | {ours_rate:>10,.0f} | "
                f"{ours_rate / theirs_rate:>5.2f}x | {ours_rate / bound:>7.1%} | "
                f"{theirs_first * 1e3:>14.1f} ms | {ours_first * 1e3:>6.1f} ms | "
                f"{agree} of {new} (first call {setup:.1f} s)",
                flush=True,
            )
            if args.profile and device.type == "cuda":
                profile_steps(generator, sampler, prompts, device, new)


if __name__ == "__main__":
    main()
