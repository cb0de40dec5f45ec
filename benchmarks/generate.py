"""Greedy generation speed: mds-generate's Generator vs transformers' `generate`, same weights,
same process.

Random GPTs are built in mds_model and exported to transformers through their family's adapter
(mds_model.hf_families): the seeds' 345M GPT-2 (24 layers, hidden 1024, 16 heads;
`GPT2LMHeadModel`) and a Llama of Llama 3.2 1B's shape (16 layers, hidden 2048, 32 heads, 8
key/value heads, ffn 8192, SwiGLU, RMSNorm, untied head, theta 500000; `LlamaForCausalLM`), both
with GPT-2's vocabulary (50257). Each generates 256 new tokens after a 32-token random prompt at
batch 1 and 8 (greedy, end-of-document ignored, as the issue's probe: `min_new_tokens` for
transformers). Prints new tokens/s, our/transformers ratio, time to first token (a whole call with
one new token), how many greedy tokens agree, and the fraction of the weight-bandwidth bound:
batch x (copy bandwidth measured here) / (bytes of the weights read per step: every parameter but
the rows of the position table and, with an untied head, of the word embeddings that a step does
not read).
Variants of ours: CUDA graphs over the eager step (the default on CUDA), torch.compile of the
step under CUDA graphs, and plain eager launches; on CPU eager (the default) and compile (the
step's layers compiled, the LM head eager; its compilation is in "first call").
Usage: python benchmarks/generate.py [--device cuda|cpu] [--dtype bfloat16] [--models gpt2,llama]
       [--small | --tiny] [--variants graphs,compile,eager] [--profile]
(--models defaults to both on CUDA and to gpt2 on CPU; --small: 4-layer models of hidden 256 for
a CPU; --tiny: 2 layers of hidden 64, a 1,000-token vocabulary and 8 new tokens, a smoke run.)
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


# Each model's shape: the full one, --small's and --tiny's (GPTConfig fields over the preset's).
SHAPES = {
    "gpt2": {
        "full": {},  # --num-layers, --hidden-size, --num-attention-heads (the 345M's defaults)
        "small": dict(num_layers=4, hidden_size=256, num_attention_heads=4),
        "tiny": dict(num_layers=2, hidden_size=64, num_attention_heads=4),
    },
    "llama": {
        "full": dict(
            num_layers=16,
            hidden_size=2048,
            num_attention_heads=32,
            num_query_groups=8,
            ffn_hidden_size=8192,
        ),
        "small": dict(
            num_layers=4,
            hidden_size=256,
            num_attention_heads=4,
            num_query_groups=2,
            ffn_hidden_size=704,
        ),
        "tiny": dict(
            num_layers=2,
            hidden_size=64,
            num_attention_heads=4,
            num_query_groups=2,
            ffn_hidden_size=176,
        ),
    },
}
MODELS = tuple(SHAPES)


def model_config(args, model: str):
    from mds_model import GPTConfig

    size = "tiny" if args.tiny else "small" if args.small else "full"
    shape = dict(SHAPES[model][size])
    if model == "gpt2" and size == "full":
        shape = dict(
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads,
        )
    if model == "llama":
        shape["rotary_base"] = 500000.0  # Llama 3's
    return GPTConfig.preset(
        model,
        **shape,
        vocab_size=args.vocab_size,
        seq_length=1024,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def build_models(args, model: str, device: torch.device, dtype: torch.dtype):
    """(config, ours, theirs): one random model, ours and transformers' (its family's adapter)."""
    import transformers
    from mds_generate.loading import inference_config
    from mds_model import GPT, hf_adapter

    config = inference_config(model_config(args, model), dtype=args.dtype, device=device)
    ours = GPT(config, init_seed=1234)
    adapter = hf_adapter(config)
    hf = adapter.hf_config(config, eos_token_id=args.vocab_size - 1)
    hf_config = transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)
    with torch.device(device):  # transformers' random init, overwritten below, on the device
        theirs = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    missing, unexpected = theirs.load_state_dict(
        adapter.to_hf(ours.state_dict(), config), strict=False
    )
    tied = not config.untie_embeddings_and_output_weights
    assert not unexpected and all(tied and name == "lm_head.weight" for name in missing), missing
    if tied:
        theirs.tie_weights()
    ours = ours.to(device).eval()
    theirs = theirs.to(device, dtype).eval()
    return config, ours, theirs


def weights_read_per_step(model, config) -> int:
    """Bytes of the parameters one decoding step reads whole: all but the position table and,
    with an untied head, the word embeddings (a step reads one row of each per token)."""
    skipped = {"embedding.position_embeddings.weight"}
    if config.untie_embeddings_and_output_weights:
        skipped.add("embedding.word_embeddings.weight")
    return sum(
        p.numel() * p.element_size() for name, p in model.named_parameters() if name not in skipped
    )


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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated, of {', '.join(MODELS)} (default: both on CUDA, gpt2 on CPU)",
    )
    parser.add_argument("--small", action="store_true", help="4 layers, hidden 256 (CPU)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="2 layers, hidden 64, vocab 1000, 8-token prompts, 8 new tokens, batch 1 and 2, one "
        "timed call: a smoke run",
    )
    parser.add_argument("--num-layers", type=int, default=24, help="GPT-2's")
    parser.add_argument("--hidden-size", type=int, default=1024, help="GPT-2's")
    parser.add_argument("--num-attention-heads", type=int, default=16, help="GPT-2's")
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
    args = parser.parse_args(argv)
    if args.small and args.tiny:
        parser.error("--small or --tiny, not both")
    if args.tiny:
        args.vocab_size, args.prompt_length, args.new_tokens = 1000, 8, 8
        args.batch_sizes, args.repeats = [1, 2], 1
    device = torch.device(args.device)
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    args.models = (args.models or ("gpt2,llama" if device.type == "cuda" else "gpt2")).split(",")
    unknown = [model for model in args.models if model not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    args.variants = (args.variants or ("graphs" if device.type == "cuda" else "eager")).split(",")
    if device.type == "cpu" and not set(args.variants) <= {"eager", "compile"}:
        parser.error("--variants on CPU: eager and/or compile")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    bandwidth = measured_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{name}, {args.dtype}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, threads {torch.get_num_threads()}; copy bandwidth "
        f"{bandwidth / 1e9:,.0f} GB/s",
        flush=True,
    )
    for model in args.models:
        bench_model(args, model, device, dtype, bandwidth)


def bench_model(args, model: str, device, dtype, bandwidth: float) -> None:
    """The table of one model: each batch size and variant against transformers."""
    from mds_generate import GenerationConfig, Generator, Sampler, SamplingConfig

    torch.manual_seed(0)
    config, ours, theirs = build_models(args, model, device, dtype)
    weight_bytes = weights_read_per_step(ours, config)
    print(
        f"\n{model}: {config.num_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, {config.query_groups} key/value heads, ffn "
        f"{config.ffn_size}, vocab {args.vocab_size}: {weight_bytes / 1e9:.3f} GB of weights per "
        f"step -> bound {bandwidth / weight_bytes:,.0f} steps/s",
        flush=True,
    )
    sampler = Sampler(SamplingConfig(greedy=True), vocab_size=args.vocab_size, device=device)
    generators = {}
    for variant in args.variants:
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
        f"{'model':>5} | {'batch':>5} | {'ours':>7} | {'transformers tok/s':>18} | "
        f"{'ours tok/s':>10} | {'ratio':>6} | {'of bound':>8} | {'TTFT transformers':>17} | "
        f"{'TTFT ours':>9} | greedy tokens equal (per row)",
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
                f"{model:>5} | {batch:>5} | {variant:>7} | {theirs_rate:>18,.0f} | "
                f"{ours_rate:>10,.0f} | {ours_rate / theirs_rate:>5.2f}x | "
                f"{ours_rate / bound:>7.1%} | {theirs_first * 1e3:>14.1f} ms | "
                f"{ours_first * 1e3:>6.1f} ms | {agree} of {new} (first call {setup:.1f} s)",
                flush=True,
            )
            if args.profile and device.type == "cuda":
                profile_steps(generator, sampler, prompts, device, new)


if __name__ == "__main__":
    main()
