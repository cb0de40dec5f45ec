"""A torch.profiler trace of the reference's training step, for benchmarks/host_profile.py.

The reference (`reference_gpt.py`, or `reference_llama.py` for a Llama shape) is run, not
copied: its source up to and including its step function `one()` (argument parsing, model, fused
AdamW, torch.compile, the batch) is executed as written, with the command line
benchmarks/train.py's run_reference gives it (`--compile --mbs M --layers ... --seq ...`, and for a
Llama shape `--preset ... --kv-heads ... --ffn ... --theta ... --vocab ...`); then
`one()` is called for --profile_steps' START-1 steps unprofiled and START..END under
mds-train's own `--profile` hooks (mds_train.profiling: upstream's schedule, CPU and CUDA
activity), so the ProfilerStep spans of the two traces compare. The reference's own timing loop,
after `one()`, does not run. The trace goes into --tensorboard-dir, named as mds-train's.

Usage: python benchmarks/reference_profile.py --reference PATH --tensorboard-dir DIR
           [--shape 345m|1.3b|llama3-1b|llama3-3b|tiny] [--micro-batch N] [--profile_steps 20,22]
           [--profile pt|pt-full] [--no-compile]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path


def _train_benchmark():
    """benchmarks/train.py, for its shapes and micro-batches: both sides run the same."""
    spec = importlib.util.spec_from_file_location(
        "train_benchmark", Path(__file__).parent / "train.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_argv(benchmark, shape_name: str, micro_batch: int, *, compile_model: bool):
    """benchmarks/train.py's run_reference command line (its --steps and --peak: unused here)."""
    shapes = {**benchmark.SHAPES, "tiny": benchmark.TINY_SHAPE}
    argv = ["--compile"] if compile_model else []
    argv += ["--mbs", str(micro_batch)]
    return argv + benchmark.reference_model_flags(shape_name, shapes[shape_name])


def reference_step(path: Path, argv: list[str]):
    """The reference's `one()`, after its set-up ran with `argv` as its command line."""
    try:
        source = path.read_text()
    except OSError as error:
        raise ValueError(
            f"{path}: {error.strerror}; --reference takes reference_gpt.py or reference_llama.py"
        ) from None
    tree = ast.parse(source, filename=str(path))
    ends = [
        i
        for i, node in enumerate(tree.body)
        if isinstance(node, ast.FunctionDef) and node.name == "one"
    ]
    if not ends:
        raise ValueError(
            f"{path}: no top-level `def one()` (reference_gpt.py's training step) to profile"
        )
    setup = ast.Module(body=tree.body[: ends[0] + 1], type_ignores=[])
    namespace = {"__name__": "__main__", "__file__": str(path)}
    saved_argv = sys.argv
    sys.argv = [str(path), *argv]
    try:
        exec(compile(setup, str(path), "exec"), namespace)  # noqa: S102 - the reference, as run
    finally:
        sys.argv = saved_argv
    return namespace["one"]


def main() -> int:
    from mds_train.profiling import ProfilerFlags, StepProfiler

    benchmark = _train_benchmark()
    shapes = {**benchmark.SHAPES, "tiny": benchmark.TINY_SHAPE}
    micro_batches = {name: sizes["micro_batch"] for name, sizes in benchmark.SIZE_DEFAULTS.items()}
    micro_batches["tiny"] = benchmark.TINY_SIZE_DEFAULTS["micro_batch"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference",
        type=Path,
        required=True,
        help="reference_gpt.py, or reference_llama.py for a Llama shape",
    )
    parser.add_argument("--tensorboard-dir", type=Path, required=True, help="trace folder")
    parser.add_argument("--shape", choices=sorted(shapes), default="345m")
    parser.add_argument(
        "--micro-batch", type=int, help="default 16, 1.3b 8, llama3-1b 4, llama3-3b 2, tiny 2"
    )
    parser.add_argument("--profile_steps", default="20,22", help="START,END (default 20,22)")
    parser.add_argument("--profile", choices=("pt", "pt-full"), default="pt")
    parser.add_argument("--no-compile", action="store_true", help="the eager reference")
    args = parser.parse_args()
    try:
        flags = ProfilerFlags(profile=args.profile, profile_steps=args.profile_steps)
        micro_batch = args.micro_batch or micro_batches[args.shape]
        argv = reference_argv(benchmark, args.shape, micro_batch, compile_model=not args.no_compile)
        one = reference_step(args.reference, argv)
    except ValueError as error:
        print(f"reference_profile.py: error: {error}", file=sys.stderr)
        return 1
    import torch

    profiler = StepProfiler(
        flags, rank=0, tensorboard_dir=args.tensorboard_dir, cuda=torch.cuda.is_available()
    )
    before = set(args.tensorboard_dir.glob("*.pt.trace.json.gz"))
    for _ in range(flags.steps[1]):
        profiler.step_begin()
        one()
        profiler.step_end()
    profiler.close()
    written = sorted(set(args.tensorboard_dir.glob("*.pt.trace.json.gz")) - before)
    print(f"{args.reference} {' '.join(argv)}: steps {args.profile_steps} traced", flush=True)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
