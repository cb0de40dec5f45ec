"""mds-train's tokens/s on GPT-2 345M, GPT-3 XL 1.3B or a Llama 3 shape against the compiled
plain-PyTorch reference (`reference_gpt.py`, or `reference_llama.py` for the Llama shapes).

Runs the reference (plain PyTorch, fp32 weights under bf16 autocast, fused AdamW, torch.compile;
its own timing) and then `mds-train` itself, as a user would launch it, for each variant, both at
the same shape (`--shape`), precision (bf16) and micro-batch, GPT-2 vocabulary, no dropout, on a
tokenized dataset:
  345m   the seeds' GPT-2 345M: 24 layers, hidden 1024, 16 heads, seq 1024, micro-batch 16
  1.3b   GPT-3 XL: 24 layers, hidden 2048, 16 heads, seq 2048, micro-batch 8 (`mds-model info`
         estimates 51.5 GiB at mds-train's default without recompute: an 80 GiB H100 or an H200)
  llama3-1b  Llama 3.2 1B's shape: 16 layers, hidden 2048, 32 heads, 8 key/value heads, ffn 8192,
         seq 2048, micro-batch 4; upstream's Llama flag block (RMSNorm, SwiGLU, no biases, untied
         head, rotary theta 500000); the reference is `reference_llama.py --preset llama3-1b`
  llama3-3b  Llama 3.2 3B's: 28 layers, hidden 3072, 24 heads, 8 key/value heads, ffn 8192
Both sides read GPT-2's vocabulary padded to 50304 rows (the Llama reference with `--vocab 50304`).
Our figure is the median of the interval lines' iteration times after the warm-up, read from
metrics.jsonl (so it includes the host waits a real run has); peak memory is the run's
`max_memory_allocated` (and the allocator's reserved peak, which counts what CUDA graphs replay
in), printed beside `mds-model info`'s estimate. Prints tokens/s, MFU
(Megatron's TFLOPs formula over --peak-tflops; with recompute its f = 4 counts the recomputed
forward, so compare tokens/s across variants) and the ratios.

Variants (`--variants`, comma-separated) differ only in the optimizer path, DeepSpeed's timer, the
activation recompute, CUDA graphs, the attention kernel or FP8:
  default          --zero-stage 0: mds-train's fp32 master weights (MasterWeightAdamW) with
                   DeepSpeed in its fp32 mode (pipelines: DeepSpeed's BF16 optimizer); gradients
                   accumulated in fp32 and averaged over DP in fp32 buckets during backward; the
                   layers as CUDA graphs wherever mds-train allows them (one GPU: yes)
  bf16-reduce      default with --grad-reduce-in-bf16 (DP averaging in bf16)
  zero1            --zero-stage 1: mds-train's ShardedMasterAdamW (fp32 masters and moments
                   sharded over DP in DeepSpeed's layout and files; layers as CUDA graphs)
  zero1-eager      zero1 with --no-cuda-graph
  bf16-optimizer   --zero-stage 1 with DeepSpeed's own BF16_Optimizer (the DeepSpeed file names
                   the optimizer: torch's fused AdamW, as mds-train's client optimizer was)
  no-overflow-check  bf16-optimizer without its per-step check for inf/NaN gradients
  zero2            --zero-stage 2: ShardedMasterAdamW with the gradients sharded too (above one
                   rank)
  zero2-eager      zero2 with --no-cuda-graph
  deepspeed-zero2  --zero-stage 2 with DeepSpeed's own DeepSpeedZeroOptimizer (the file names the
                   optimizer)
  zero3            --zero-stage 3: torch's FSDP2 over the layers, fp32 shards stepped by
                   mds-train's FullyShardedAdamW (DeepSpeed's stage-3 files)
  deepspeed-zero3  --zero-stage 3 with DeepSpeed's own stage 3 (the file names the optimizer)
  fp16             default in fp16 instead of bf16 (DeepSpeed's dynamic loss scaling)
  ds-timers        default with DeepSpeed's throughput timer on (its default; off in mds-train)
  selective        default with --recompute-granularity selective (attention's core recomputed)
  full             default with --recompute-granularity full (every layer recomputed)
  eager            default with --no-cuda-graph (every layer's kernels launched from Python)
  cudnn            default with --attention-backend fused (cuDNN's fused attention through SDPA)
  fp8              default with --fp8-hybrid (E4M3 forward, E5M2 gradients, delayed scaling)
  fp8-e4m3         default with --fp8-e4m3
  fp8-bf16-wgrad   fp8 with --no-fp8-wgrad (weight gradients in bf16)
  fp8-cudnn        fp8 with --attention-backend fused
  fp8-margin       fp8 with --fp8-margin 2
  fp8-history      fp8 with --fp8-amax-history-len 16 --fp8-amax-compute-algo max
  fp8-history-1024 fp8 with --fp8-amax-history-len 1024 --fp8-amax-compute-algo max
                   (Transformer Engine's default recipe)
With `default` and a variant that differs from it only in the ZeRO stage, optimizer or CUDA
graphs (zero1, zero2, zero3, the -eager and deepspeed- ones, bf16-optimizer, no-overflow-check,
eager), the largest relative difference of their logged losses is printed. With `default` and an
fp8 variant in one run, each fp8 variant's speed is also given against `default` (FP8's target
is our own bf16 step), its MFU against the FP8 ceiling (--fp8-peak-tflops, twice the bf16 one on
Hopper) too, and the two loss curves side by side: every tenth of the run, and the largest
relative difference of their 10-iteration means after the first 10 iterations; with `eager` in
the run too, the same measure between the two bf16 runs (the step is not bitwise deterministic):
the spread any single-run comparison carries. `--seeds 1,2,3,4` runs every variant once at each
seed (mds-train's `--seed`: initial weights and data order, so a variant's run and `default`'s
at one seed read the same tokens): speeds are then the seeds' median and the curves compared are
the seeds' mean curves, with each seed's own pair and the standard error of the seed-paired
differences at the worst window beside them (one pair of 300-iteration runs at micro-batch 4
differs by about 1% between two bf16 runs alone). `--lr-warmup-iters` sets the warm-up (default
2); `--losses-json PATH` keeps every run's logged losses, and benchmarks/loss_curves.py compares
the files of several calls the same way.
`--contend N` keeps N host cores busy with spinning processes from before the reference starts
until the last variant ends, so both sides run on the same contended host (the header says so).
`--cpus 0,1` (taskset's list: `0-3,8`) pins this script, and so the reference, mds-train and the
spinners, to those cores: `--cpus 0,1 --contend 2` is a host slowed the same way for both sides
wherever it runs (on some hosts `--contend 16` alone slowed nothing).
`--profile-dir DIR` also traces iterations --profile-steps (START,END; default 21,30: ten steps,
one of them waiting for the loss line) of every variant (`--profile pt` into DIR/VARIANT) and,
with --reference, of the compiled reference (benchmarks/reference_profile.py, into
DIR/reference, after its timing run): `benchmarks/host_profile.py DIR/* --kernels 40` then says
where each side's host and device time goes. The profiler slows the traced steps, and
--iterations must reach END: a profiled run's tokens/s are not a headline figure.
With `--nproc N` every variant runs data-parallel over N GPUs under torchrun (`--tp`/`--pp` set the
model-parallel sizes); the global batch is micro-batch x DP. `--scaling` (with `--nproc N`, TP and
PP 1) runs each variant on one GPU too, just before its DP = N run, with the same micro-batches per
rank (`--global-batch` / N), and prints DP = N's tokens/s over one GPU's.

`--tiny` is a smoke run that finishes in seconds on a CPU (2 layers, hidden 64, seq 64, micro-batch
2, 6 iterations): it checks the script, not the speed. Figures a run cannot measure (peak memory
without CUDA) print as n/a.

Usage: python benchmarks/train.py --data-path P --vocab-file V --merge-file M
           [--reference PATH] [--shape 345m|1.3b|llama3-1b|llama3-3b]
           [--variants default,bf16-optimizer]
           [--contend N] [--cpus LIST] [--iterations 40] [--nproc 1 [--scaling]] [--tiny]
           [--seeds 1,2,3,4] [--lr-warmup-iters 2] [--losses-json PATH]
           [--profile-dir DIR [--profile-steps 21,30]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES = {
    "345m": dict(num_layers=24, hidden_size=1024, num_attention_heads=16, seq_length=1024),
    "1.3b": dict(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048),
    "llama3-1b": dict(
        num_layers=16,
        hidden_size=2048,
        num_attention_heads=32,
        seq_length=2048,
        num_query_groups=8,
        ffn_hidden_size=8192,
    ),
    "llama3-3b": dict(
        num_layers=28,
        hidden_size=3072,
        num_attention_heads=24,
        seq_length=2048,
        num_query_groups=8,
        ffn_hidden_size=8192,
    ),
}
TINY_SHAPE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=64)
TINY_LLAMA_SHAPE = {**TINY_SHAPE, "num_query_groups": 2, "ffn_hidden_size": 176}
# The shape fields as mds-train's flags (upstream's spellings).
SHAPE_FLAGS = {
    "num_layers": "--num-layers",
    "hidden_size": "--hidden-size",
    "num_attention_heads": "--num-attention-heads",
    "seq_length": "--seq-length",
    "num_query_groups": "--num-key-value-heads",
    "ffn_hidden_size": "--ffn-hidden-size",
}
# upstream's Llama scripts' flag block, with Llama 3's rotary theta (the reference's default)
LLAMA_THETA = 500000
LLAMA_FLAGS = [
    *("--swiglu", "--normalization", "rmsnorm", "--disable-bias-linear"),
    *("--untie-embeddings-and-output-weights", "--use-rotary-position-embeddings"),
    *("--rotary-position-embeddings-theta", str(LLAMA_THETA)),
]
PADDED_VOCAB = 50304  # GPT-2's 50257 padded to a multiple of 128 (mds-train's default)
# Defaults of the run's size per shape, and --tiny's (any given flag wins). 1.3B's micro-batch 8:
# `mds-model info ... --micro-batch-size 8 --params-dtype bfloat16` estimates 51.5 GiB per GPU.
SIZE_DEFAULTS = {
    "345m": dict(iterations=40, log_interval=10, warmup=10, micro_batch=16),
    "1.3b": dict(iterations=30, log_interval=5, warmup=10, micro_batch=8),
    "llama3-1b": dict(iterations=30, log_interval=5, warmup=10, micro_batch=4),
    "llama3-3b": dict(iterations=30, log_interval=5, warmup=10, micro_batch=2),
}
TINY_SIZE_DEFAULTS = dict(iterations=6, log_interval=1, warmup=2, micro_batch=2)
# An optimizer named in the DeepSpeed file keeps DeepSpeed's own ZeRO-1 (BF16_Optimizer) in charge:
# torch's fused AdamW (`torch_adam`), the flags' betas and eps.
DEEPSPEED_ADAMW = {
    "type": "AdamW",
    "params": {"torch_adam": True, "fused": True, "betas": [0.9, 0.95], "eps": 1e-8},
}
VARIANT_CONFIGS = {  # name: (--zero-stage, DeepSpeed JSON merged over the derived one, flags)
    "default": (0, {}, []),
    "bf16-reduce": (0, {}, ["--grad-reduce-in-bf16"]),
    "zero1": (1, {}, []),
    "zero1-eager": (1, {}, ["--no-cuda-graph"]),
    "bf16-optimizer": (1, {"optimizer": DEEPSPEED_ADAMW}, []),
    "no-overflow-check": (
        1,
        {"optimizer": DEEPSPEED_ADAMW, "bf16": {"check_grad_overflow": False}},
        [],
    ),
    "zero2": (2, {}, []),
    "zero2-eager": (2, {}, ["--no-cuda-graph"]),
    "deepspeed-zero2": (2, {"optimizer": DEEPSPEED_ADAMW}, []),
    "zero3": (3, {}, []),
    "deepspeed-zero3": (3, {"optimizer": DEEPSPEED_ADAMW}, []),
    "fp16": (0, {}, ["--fp16"]),
    # DeepSpeed's throughput timer back on (its default): a device sync per forward and per step.
    "ds-timers": (0, {"timers": {"throughput": {"enabled": True}}}, []),
    "selective": (0, {}, ["--recompute-granularity", "selective"]),
    "full": (0, {}, ["--recompute-granularity", "full"]),
    "eager": (0, {}, ["--no-cuda-graph"]),
    "cudnn": (0, {}, ["--attention-backend", "fused"]),
    "fp8": (0, {}, ["--fp8-hybrid"]),
    "fp8-e4m3": (0, {}, ["--fp8-e4m3"]),
    "fp8-bf16-wgrad": (0, {}, ["--fp8-hybrid", "--no-fp8-wgrad"]),
    "fp8-cudnn": (0, {}, ["--fp8-hybrid", "--attention-backend", "fused"]),
    # Scales with headroom, and scales from the largest amax of 16 steps (Transformer Engine's
    # common recipe): whether saturating a growing tensor at last step's scale moves the curve.
    "fp8-margin": (0, {}, ["--fp8-hybrid", "--fp8-margin", "2"]),
    "fp8-history": (
        0,
        {},
        ["--fp8-hybrid", "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "max"],
    ),
    # Transformer Engine's own default recipe (DelayedScaling: 1,024 steps of amax, their max).
    "fp8-history-1024": (
        0,
        {},
        ["--fp8-hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"],
    ),
}
CURVE_WINDOW = 10  # iterations per mean in the loss-curve comparison


def recompute_of(variant: str) -> str:
    """GPTConfig.activation_checkpointing that a variant's flags select."""
    flags = VARIANT_CONFIGS[variant][2]
    if "--recompute-granularity" in flags:
        return flags[flags.index("--recompute-granularity") + 1]
    return "none"


def parse_cpus(text: str) -> set[int]:
    """taskset -c's list: core numbers and ranges, comma-separated ("0,1", "0-3,8")."""
    cores: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None or int(match[2] or match[1]) < int(match[1]):
            raise ValueError(f"--cpus {text}: give core numbers and ranges, e.g. 0,1 or 0-3,8")
        cores.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    return cores


@contextlib.contextmanager
def contended_host(num_spinners: int):
    """num_spinners processes that each keep one host core busy until the block ends (0: none)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(num_spinners)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def is_llama(shape_name: str) -> bool:
    return shape_name.startswith("llama")


def reference_model_flags(shape_name: str, shape: dict) -> list[str]:
    """The reference's model at `shape`: reference_gpt.py's sizes, and for a Llama shape
    reference_llama.py's key/value heads, ffn, theta and vocabulary too."""
    flags = ["--seq", str(shape["seq_length"]), "--layers", str(shape["num_layers"])]
    flags += ["--hidden", str(shape["hidden_size"]), "--heads", str(shape["num_attention_heads"])]
    if is_llama(shape_name):
        flags += ["--preset", shape_name, "--kv-heads", str(shape["num_query_groups"])]
        flags += ["--ffn", str(shape["ffn_hidden_size"]), "--theta", str(LLAMA_THETA)]
        flags += ["--vocab", str(PADDED_VOCAB)]
    return flags


def run_reference(args) -> float | None:
    command = [sys.executable, str(args.reference), "--compile", "--mbs", str(args.micro_batch)]
    command += ["--steps", "20", "--peak", str(args.peak_tflops * 1e12)]
    command += reference_model_flags(args.shape_name, args.shape)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:  # out of memory at a micro-batch search's top, say
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"{args.reference.name}: failed (exit {result.returncode}): {last}", flush=True)
        return None
    print(result.stdout.strip(), flush=True)
    return float(re.search(r"tok/s=([\d,]+)", result.stdout).group(1).replace(",", ""))


def profile_reference(args) -> None:
    """The compiled reference's trace of --profile-steps, beside our variants' (DIR/reference)."""
    command = [sys.executable, str(Path(__file__).parent / "reference_profile.py")]
    command += ["--reference", str(args.reference), "--shape", args.shape_name]
    command += ["--micro-batch", str(args.micro_batch), "--profile_steps", args.profile_steps]
    command += ["--tensorboard-dir", str(args.profile_dir / "reference")]
    subprocess.run(command, check=True)


def profile_flags(args, variant: str) -> list[str]:
    """mds-train's own profiler flags for a variant's run under --profile-dir (none without)."""
    if args.profile_dir is None:
        return []
    traces = args.profile_dir / variant
    return [
        "--profile",
        "pt",
        "--profile_steps",
        args.profile_steps,
        "--tensorboard-dir",
        str(traces),
    ]


def train_command(
    args, out: Path, zero: int, ds_file: Path | None, extra_flags: list[str]
) -> list[str]:
    flags = [
        *extra_flags,
        *(LLAMA_FLAGS if is_llama(args.shape_name) else []),
        *(item for name, value in args.shape.items() for item in (SHAPE_FLAGS[name], str(value))),
        *("--micro-batch-size", str(args.micro_batch)),
        *("--train-iters", str(args.iterations), "--lr", "1e-4", "--min-lr", "1e-5"),
        *("--lr-decay-style", "cosine", "--lr-warmup-iters", str(args.lr_warmup_iters)),
        *("--weight-decay", "0.01"),
        *("--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0"),
        *([] if "--fp16" in extra_flags else ["--bf16"]),
        *("--hidden-dropout", "0", "--attention-dropout", "0", "--zero-stage", str(zero)),
        *("--data-path", args.data_path, "--vocab-file", args.vocab_file),
        *("--merge-file", args.merge_file, "--split", "100,0,0", "--eval-iters", "0"),
        *("--data-cache-path", str(out.parent / "index-cache")),  # not beside the user's data
        *("--log-interval", str(args.log_interval), "--output-dir", str(out)),
        *("--peak-tflops", str(args.peak_tflops)),
        *([] if args.seed is None else ["--seed", str(args.seed)]),
        *("--tensor-model-parallel-size", str(args.tp)),
        *("--pipeline-model-parallel-size", str(args.pp)),
    ]
    if args.global_batch:
        flags += ["--global-batch-size", str(args.global_batch)]
    if ds_file is not None:
        flags += ["--deepspeed_config", str(ds_file)]
    if args.nproc == 1:
        return [sys.executable, "-m", "mds_train", *flags]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    torchrun += ["--nproc_per_node", str(args.nproc)]
    return [*torchrun, "-m", "mds_train", *flags]


def run_ours(args, variant: str, work: Path) -> dict:
    zero, extra, extra_flags = VARIANT_CONFIGS[variant]
    work.mkdir(parents=True, exist_ok=True)
    out = work / variant
    ds_file = None
    if extra:
        ds_file = work / f"{variant}.json"
        ds_file.write_text(json.dumps(extra))
    command = train_command(args, out, zero, ds_file, [*extra_flags, *profile_flags(args, variant)])
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        print(f"{variant}: failed (exit {result.returncode})\n{result.stderr[-3000:]}", flush=True)
        return {}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    every = [r for r in records if r["event"] == "train"]
    train = [r for r in every if r["iteration"] > args.warmup]
    ms = statistics.median(r["ms_per_iteration"] for r in train)
    batch = train[-1]["global_batch_size"]
    mfus = [r["mfu"] for r in train if r["mfu"] is not None]
    # None where the run has no CUDA device (mds-train records null then).
    memories = [r["max_memory_allocated_gib"] for r in train]
    reserved = [r["max_memory_reserved_gib"] for r in train]
    return {
        "tokens_per_second": batch * args.shape["seq_length"] / (ms / 1000.0),
        "ms": ms,
        "global_batch": batch,
        "mfu": statistics.median(mfus) if mfus else None,
        "memory_gib": None if None in memories else max(memories),
        "reserved_gib": None if None in reserved else max(reserved),
        "loss": train[-1]["lm_loss"],
        "first_loss": next(r["lm_loss"] for r in every if r["lm_loss"] is not None),
        "skipped": sum(r["skipped_iterations"] for r in every),
        "loss_scale": train[-1]["loss_scale"],
        "losses": {r["iteration"]: r["lm_loss"] for r in every},
    }


def reserved_note(reserved_gib: float | None) -> str:
    """The allocator's reserved peak beside the allocated one: a CUDA graph replays inside memory
    its pool keeps reserved, which max_memory_allocated does not count."""
    return "" if reserved_gib is None else f" ({reserved_gib:.1f} reserved)"


def estimated_memory_gib(args, zero: int, recompute: str) -> float:
    from mds_model import GPTConfig, Plan, estimate, for_tensor_parallel

    config = GPTConfig.preset(
        "llama" if is_llama(args.shape_name) else "gpt2",
        **args.shape,
        **({"rotary_base": float(LLAMA_THETA)} if is_llama(args.shape_name) else {}),
        vocab_size=50257,
        params_dtype="bfloat16",
        activation_checkpointing=recompute,
    )
    plan = Plan(
        tensor_model_parallel_size=args.tp,
        pipeline_model_parallel_size=args.pp,
        data_parallel_size=args.nproc // (args.tp * args.pp),
        micro_batch_size=args.micro_batch,
        zero_stage=zero,
    )
    memory = estimate(for_tensor_parallel(config, args.tp), plan)["memory_bytes_per_gpu"]
    return memory["total"] / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", required=True)
    parser.add_argument("--vocab-file", required=True)
    parser.add_argument("--merge-file", required=True)
    parser.add_argument("--reference", type=Path)
    parser.add_argument(
        "--shape", dest="shape_name", choices=sorted(SHAPES), default="345m", help="model shape"
    )
    parser.add_argument("--variants", default="default")
    parser.add_argument(
        "--contend", type=int, default=0, help="host cores kept busy during every run (default 0)"
    )
    parser.add_argument(
        "--cpus", help="host cores to pin every run and spinner to, as taskset -c takes them"
    )
    parser.add_argument("--iterations", type=int, help="default 40, 1.3b 30 (--tiny: 6)")
    parser.add_argument("--log-interval", type=int, help="default 10, 1.3b 5 (--tiny: 1)")
    parser.add_argument("--warmup", type=int, help="iterations left out of timing; default 10 (2)")
    parser.add_argument(
        "--lr-warmup-iters",
        type=int,
        default=2,
        help="iterations of linear warm-up to the peak learning rate 1e-4 (default 2)",
    )
    parser.add_argument(
        "--seeds",
        type=lambda text: [int(seed) for seed in text.split(",")],
        help="run every variant once at each of these seeds (mds-train --seed: initial weights "
        "and data order); speeds are the seeds' median, loss curves their mean",
    )
    parser.add_argument(
        "--losses-json",
        type=Path,
        help="write every run's logged losses here, by variant and seed, for "
        "benchmarks/loss_curves.py",
    )
    parser.add_argument("--micro-batch", type=int, help="default 16, 1.3b 8 (--tiny: 2)")
    parser.add_argument("--global-batch", type=int, help="default: micro-batch x DP")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="with --nproc N > 1: each variant also on one GPU, and DP = N over one GPU printed",
    )
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument(
        "--fp8-peak-tflops", type=float, default=1979.0, help="dense FP8 ceiling (H100/H200)"
    )
    parser.add_argument("--tiny", action="store_true", help="a CPU smoke run of a tiny GPT")
    parser.add_argument("--profile-dir", type=Path, help="trace every run's --profile-steps here")
    parser.add_argument("--profile-steps", default="21,30", help="START,END (default 21,30)")
    args = parser.parse_args()
    if args.tiny and args.reference is not None:
        parser.error(
            "--tiny is a smoke run of another shape than the reference's: leave out --reference"
        )
    if args.contend < 0:
        parser.error("--contend counts host cores to keep busy: give 0 or more")
    if args.scaling and (args.nproc < 2 or args.tp != 1 or args.pp != 1):
        parser.error("--scaling compares data parallelism: give --nproc 2 or more, TP 1, PP 1")
    if args.scaling and args.global_batch and args.global_batch % args.nproc:
        parser.error(f"--scaling: --global-batch {args.global_batch} must divide by --nproc")
    unknown = [v for v in args.variants.split(",") if v not in VARIANT_CONFIGS]
    if unknown:
        parser.error(
            f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANT_CONFIGS)}"
        )
    if args.cpus is not None:
        try:
            os.sched_setaffinity(0, parse_cpus(args.cpus))  # children inherit it
        except (ValueError, OSError) as error:
            parser.error(str(error) if isinstance(error, ValueError) else f"--cpus: {error}")
    tiny = TINY_LLAMA_SHAPE if is_llama(args.shape_name) else TINY_SHAPE
    args.shape = tiny if args.tiny else SHAPES[args.shape_name]
    for name, default in (
        TINY_SIZE_DEFAULTS if args.tiny else SIZE_DEFAULTS[args.shape_name]
    ).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.profile_dir is not None:
        end = args.profile_steps.rpartition(",")[2]
        if not end.isdigit() or int(end) > args.iterations:
            parser.error(
                f"--profile-steps {args.profile_steps}: give START,END with END <= --iterations "
                f"({args.iterations})"
            )
    print(header(args), flush=True)
    with contended_host(args.contend):
        measure(args)
        if args.profile_dir is not None and args.reference is not None:
            profile_reference(args)


def header(args) -> str:
    shape = "tiny" if args.tiny else args.shape_name
    s = args.shape
    pinned = ""
    if args.cpus is not None:
        cores = sorted(os.sched_getaffinity(0))
        pinned = f"; every run pinned to cores {','.join(map(str, cores))} (--cpus {args.cpus})"
    return (
        f"shape {shape} ({s['num_layers']} layers, hidden {s['hidden_size']}, "
        f"{s['num_attention_heads']} heads"
        + (f" ({s['num_query_groups']} key/value)" if "num_query_groups" in s else "")
        + (f", ffn {s['ffn_hidden_size']}" if "ffn_hidden_size" in s else "")
        + f", seq {s['seq_length']}), "
        f"micro-batch {args.micro_batch}; host: {args.contend} of {os.cpu_count()} cores kept "
        f"busy by spinning processes during every run (--contend {args.contend}){pinned}"
        + ("" if args.profile_dir is None else f"; profiled: steps {args.profile_steps} traced")
    )


def measure(args) -> None:
    reference = None
    if args.reference is not None:
        reference = run_reference(args)
        if reference is not None:
            print(
                f"{args.reference.name} --compile: {reference:,.0f} tokens/s (measured, this call)"
            )
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as work:
        # Seed-major, so a slow stretch of the machine falls on every variant alike.
        for seed in args.seeds or [None]:
            seeded = argparse.Namespace(**vars(args), seed=seed)
            seed_work = Path(work) if seed is None else Path(work) / f"seed-{seed}"
            for variant in args.variants.split(","):
                figures = run_variant(seeded, variant, seed_work, reference)
                if figures:
                    runs.setdefault(variant, []).append(figures)
                    save_losses(args, runs)  # after every run: a call cut short keeps them
    results = {variant: over_seeds(figures) for variant, figures in runs.items()}
    if args.seeds:
        for variant, figures in results.items():
            print(
                f"mds-train {variant} over seeds {', '.join(map(str, args.seeds))}: median "
                f"{figures['tokens_per_second']:,.0f} tokens/s; the losses below are the seeds' "
                "mean",
                flush=True,
            )
    if "default" in results and any(variant.startswith("fp8") for variant in results):
        passes = corpus_passes(args, results["default"]["global_batch"])
        if passes > 1:
            print(
                f"note: each run reads the corpus's tokens {passes:.2f} times: after iteration "
                f"{int(args.iterations / passes)} the loss curves below also compare how the runs "
                "fit tokens they have already seen",
                flush=True,
            )
    compare_fp8(args, results)
    compare_zero(results)


def save_losses(args, runs: dict[str, list[dict]]) -> None:
    """--losses-json: {variant: [{"seed": S, "losses": {iteration: loss}}, ...]}, which
    benchmarks/loss_curves.py compares across calls."""
    if args.losses_json is not None:
        losses = {
            variant: [{"seed": run["seed"], "losses": run["losses"]} for run in figures]
            for variant, figures in runs.items()
        }
        args.losses_json.write_text(json.dumps(losses, indent=1) + "\n")


def run_variant(args, variant: str, work: Path, reference: float | None) -> dict:
    """One variant at one seed (and on one GPU first, with --scaling): its figures, printed."""
    seed = "" if args.seed is None else f" [seed {args.seed}]"
    one_gpu = None
    if args.scaling:
        one = one_gpu_args(args)
        one_gpu = run_ours(one, variant, work / "one-gpu")
        if one_gpu:
            print(describe(one, variant, one_gpu, reference) + seed, flush=True)
    figures = run_ours(args, variant, work)
    if not figures:
        return {}
    figures["seed"] = args.seed
    print(describe(args, variant, figures, reference) + seed, flush=True)
    if one_gpu:
        print(
            f"mds-train {variant}: DP = {args.nproc} at "
            f"{figures['tokens_per_second'] / one_gpu['tokens_per_second']:.3f}x one GPU's "
            "tokens/s (same micro-batch, same micro-batches per rank, this call)",
            flush=True,
        )
    return figures


def over_seeds(runs: list[dict]) -> dict:
    """One variant's runs at several seeds as one: the median speed, the mean loss curve (each
    seed's run and its counterpart in another variant read the same data, so mean curves
    compare like with like). One run is itself."""
    if len(runs) == 1:
        return runs[0]
    merged = dict(runs[0])
    merged["tokens_per_second"] = statistics.median(run["tokens_per_second"] for run in runs)
    merged["ms"] = statistics.median(run["ms"] for run in runs)
    merged["losses"] = mean_curve([run["losses"] for run in runs])
    merged["runs"] = runs
    return merged


def mean_curve(curves: list[dict[int, float]]) -> dict[int, float]:
    """The mean loss at each iteration every curve logged."""
    logged = set.intersection(*(set(curve) for curve in curves))
    return {i: statistics.fmean(curve[i] for curve in curves) for i in sorted(logged)}


def one_gpu_args(args):
    """--scaling's one-GPU run: one process with the micro-batches per step each rank has."""
    one = argparse.Namespace(**vars(args))
    one.nproc = 1
    if args.global_batch:
        one.global_batch = args.global_batch // args.nproc
    return one


def describe(args, variant: str, figures: dict, reference: float | None) -> str:
    """One variant's line: tokens/s (and against the reference), ms, MFU, memory, losses."""
    ratio = ""
    if reference:
        ratio = f" = {figures['tokens_per_second'] / reference:.3f}x reference"
    zero = VARIANT_CONFIGS[variant][0]
    if figures["memory_gib"] is None:
        memory = "peak n/a (no CUDA)"  # nothing measured to set the estimate against
    else:
        memory = (
            f"peak {figures['memory_gib']:.1f} GiB allocated"
            + reserved_note(figures["reserved_gib"])
            + ", mds-model info estimate "
            f"{estimated_memory_gib(args, zero, recompute_of(variant)):.1f} GiB"
        )
    mfu = "n/a" if figures["mfu"] is None else f"{figures['mfu']:.1%}"
    scaling = ""
    if figures["loss_scale"] is not None:
        scaling = f", {figures['skipped']} skipped, loss scale {figures['loss_scale']:g}"
    return (
        f"mds-train {variant} (nproc {args.nproc}, TP {args.tp}, PP {args.pp}): "
        f"{figures['tokens_per_second']:,.0f} tokens/s{ratio}, {figures['ms']:.1f} ms/it, "
        f"MFU {mfu}, {memory}, "
        f"loss {figures['first_loss']:.3f} -> {figures['loss']:.3f}{scaling}"
    )


def compare_zero(results: dict[str, dict]) -> None:
    """Each variant that differs from `default` only in its ZeRO stage, optimizer path or CUDA
    graphs (the same bf16 work): the largest relative difference of their logged losses."""
    base = results.get("default")
    for variant, figures in results.items():
        _, _, flags = VARIANT_CONFIGS[variant]
        if base is None or variant == "default" or flags not in ([], ["--no-cuda-graph"]):
            continue
        shared = sorted(set(figures["losses"]) & set(base["losses"]))
        worst = max(
            abs(figures["losses"][i] - base["losses"][i]) / abs(base["losses"][i]) for i in shared
        )
        print(
            f"mds-train {variant}: losses against default's: largest relative difference "
            f"{worst:.1e} over {len(shared)} logged iterations",
            flush=True,
        )


def compare_fp8(args, results: dict[str, dict]) -> None:
    """Each FP8 variant against `default` (bf16): speed, MFU on both ceilings, loss curves."""
    bf16 = results.get("default")
    for variant, figures in results.items():
        if bf16 is None or not variant.startswith("fp8"):
            continue
        speedup = figures["tokens_per_second"] / bf16["tokens_per_second"]
        mfu = figures["mfu"]
        ceilings = ""
        if mfu is not None:
            fp8_mfu = mfu * args.peak_tflops / args.fp8_peak_tflops
            ceilings = (
                f"; MFU {mfu:.1%} of the bf16 ceiling ({args.peak_tflops:g} TFLOP/s), "
                f"{fp8_mfu:.1%} of the FP8 ceiling ({args.fp8_peak_tflops:g})"
            )
        print(f"mds-train {variant}: {speedup:.3f}x mds-train default (bf16){ceilings}")
        print_curves(variant, figures["losses"], "bf16", bf16["losses"])
        if "runs" in figures and "runs" in bf16:
            print(f"  {paired_seeds(figures['runs'], bf16['runs'])}")
    # The measure's own noise: the bf16 step is not bitwise deterministic, so a second bf16
    # run (eager: the same kernels, launched from Python) drifts from the first.
    if bf16 is not None and "eager" in results and any(v.startswith("fp8") for v in results):
        spread = curve_difference(results["eager"]["losses"], bf16["losses"])
        print(
            f"mds-train eager against default (both bf16): largest relative difference of "
            f"{CURVE_WINDOW}-iteration means after iteration {CURVE_WINDOW}: {spread:.2%} "
            "(the run-to-run spread of the measure)"
        )
        if "runs" in results["eager"] and "runs" in bf16:
            print(f"  {paired_seeds(results['eager']['runs'], bf16['runs'])}")


def print_curves(name: str, ours: dict[int, float], base: str, theirs: dict[int, float]) -> None:
    """Two loss curves side by side every tenth of the run, and their largest difference."""
    shared = sorted(set(ours) & set(theirs))
    every = max(1, len(shared) // 10)
    print(f"  iteration  {base} loss  {name} loss  relative difference")
    for iteration in shared[every - 1 :: every]:
        a, b = theirs[iteration], ours[iteration]
        print(f"  {iteration:9d}  {a:9.4f}  {b:9.4f}  {(b - a) / a:+.2%}")
    print(
        f"  largest relative difference of {CURVE_WINDOW}-iteration means after iteration "
        f"{CURVE_WINDOW}: {curve_difference(ours, theirs):.2%}"
    )


def corpus_passes(args, global_batch: int) -> float:
    """How many times a run of `global_batch` samples a step (as mds-train recorded it) reads
    --data-path's tokens (all of them train: --split 100,0,0)."""
    from mds_indexed_data.reader import IndexedDatasetReader

    corpus = IndexedDatasetReader(args.data_path).num_tokens
    return args.iterations * global_batch * args.shape["seq_length"] / corpus


def curve_difference(ours: dict[int, float], theirs: dict[int, float]) -> float:
    """The largest relative difference of two loss curves' CURVE_WINDOW-iteration means after
    the first window."""
    return max((abs(d) for d in window_differences(ours, theirs).values()), default=0.0)


def window_differences(ours: dict[int, float], theirs: dict[int, float]) -> dict[int, float]:
    """(ours - theirs) / theirs of the two curves' CURVE_WINDOW-iteration means, by window, after
    the first window. Each logged loss is its interval's mean: a window's mean is the mean of
    its lines."""
    windows: dict[int, list[int]] = {}
    for iteration in sorted(set(ours) & set(theirs)):
        if iteration > CURVE_WINDOW:
            windows.setdefault((iteration - 1) // CURVE_WINDOW, []).append(iteration)
    differences = {}
    for window, iterations in windows.items():
        mean_theirs = statistics.fmean(theirs[i] for i in iterations)
        mean_ours = statistics.fmean(ours[i] for i in iterations)
        differences[window] = (mean_ours - mean_theirs) / mean_theirs
    return differences


def paired_seeds(ours: list[dict], theirs: list[dict]) -> str:
    """Two variants run at the same seeds: each seed's own curve difference, and the mean
    curves' worst window with the standard error of its seed-paired differences (how far the
    mean itself can be trusted)."""
    theirs_by_seed = {run["seed"]: run["losses"] for run in theirs}
    pairs = [
        (run["losses"], theirs_by_seed[run["seed"]])
        for run in ours
        if run["seed"] in theirs_by_seed
    ]
    if len(pairs) < 2:
        return "fewer than two seeds ran on both sides: no paired figures"
    per_seed = [window_differences(o, t) for o, t in pairs]
    singles = [max(abs(d) for d in differences.values()) for differences in per_seed]
    windows = set.intersection(*(set(d) for d in per_seed))
    means = {w: statistics.fmean(d[w] for d in per_seed) for w in windows}
    worst = max(windows, key=lambda w: abs(means[w]))
    error = statistics.stdev(d[worst] for d in per_seed) / len(per_seed) ** 0.5
    return (
        f"each seed's own pair: {', '.join(f'{single:.2%}' for single in singles)}; mean of the "
        f"seeds' paired differences at the worst window (iterations {worst * CURVE_WINDOW + 1}-"
        f"{(worst + 1) * CURVE_WINDOW}): {means[worst]:+.2%} +- {error:.2%} (standard error)"
    )


if __name__ == "__main__":
    main()
