"""Benchmark: `mds-tokenize learn` against the Hugging Face `tokenizers` byte-level BpeTrainer,
learning the same vocabulary size from the same jsonl on the same cores; prints each side's time and
peak RSS and the ratio. Each side runs in its own subprocess (best of --repeats), so that the
peaks do not mix.

    python3 benchmarks/learn.py [--input ../shared/data/openwebtext-1000.jsonl] [--vocab-size 32000]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INPUT = REPO_ROOT.parent / "shared" / "data" / "openwebtext-1000.jsonl"
END_OF_TEXT = "<|endoftext|>"


def run_ours(*, input_path: Path, vocab_size: int, output_dir: Path, workers: int) -> dict:
    from mds_tokenize.learn.config import LearnConfig
    from mds_tokenize.learn.learner import run

    config = LearnConfig(
        inputs=(input_path,),
        vocab_size=vocab_size,
        output_dir=output_dir,
        min_frequency=2,
        special_tokens=(END_OF_TEXT,),
        workers=workers,
    )
    started = time.perf_counter()
    run(config)
    seconds = time.perf_counter() - started
    merges = (output_dir / "merges.txt").read_text(encoding="utf-8").split("\n")[1:-1]
    return {"seconds": seconds, "merges": merges}


def run_hf(*, input_path: Path, vocab_size: int, output_dir: Path, workers: int) -> dict:
    os.environ["RAYON_NUM_THREADS"] = str(workers)  # before tokenizers starts its thread pool
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    started = time.perf_counter()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )

    def texts():
        with open(input_path, encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)["text"]

    tokenizer.train_from_iterator(texts(), trainer=trainer)
    tokenizer.model.save(str(output_dir))
    seconds = time.perf_counter() - started
    merges = (output_dir / "merges.txt").read_text(encoding="utf-8").split("\n")[1:-1]
    return {"seconds": seconds, "merges": merges}


def child(side: str, input_path: Path, vocab_size: int, workers: int) -> None:
    """Runs one side once and prints its result as one JSON line on stdout."""
    with tempfile.TemporaryDirectory() as output_dir:
        learner = run_ours if side == "ours" else run_hf
        result = learner(
            input_path=input_path,
            vocab_size=vocab_size,
            output_dir=Path(output_dir),
            workers=workers,
        )
    # ru_maxrss is in KiB on Linux; worker processes (ours) count as children.
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["peak_child_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps(result))


def measure(side: str, args) -> dict:
    best = None
    for _ in range(args.repeats):
        completed = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                side,
                "--input",
                str(args.input),
                "--vocab-size",
                str(args.vocab_size),
                "--workers",
                str(args.workers),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(completed.stdout.strip().splitlines()[-1])
        if best is None or result["seconds"] < best["seconds"]:
            best = result
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT, help="jsonl with a 'text' key")
    parser.add_argument(
        "--vocab-size", type=int, default=32000, help="vocabulary size for both sides"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="processes (ours) and threads (HF) [default: CPUs available]",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per side; the fastest is reported"
    )
    parser.add_argument("--child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.input, args.vocab_size, args.workers)
        return
    if not args.input.is_file():
        sys.exit(f"--input {args.input}: no such file; pass the openwebtext-1000.jsonl path")
    print(
        f"input {args.input} ({args.input.stat().st_size / 1e6:.1f} MB), vocab {args.vocab_size}, "
        f"{args.workers} workers, best of {args.repeats}"
    )
    ours = measure("ours", args)
    hf = measure("hf", args)
    for name, result in (("mds-tokenize learn", ours), ("HF tokenizers BpeTrainer", hf)):
        print(
            f"{name:26s} {result['seconds']:7.2f} s   peak RSS {result['peak_rss_mib']:7.1f} MiB "
            f"(largest child {result['peak_child_rss_mib']:.1f} MiB)   "
            f"{len(result['merges'])} merges"
        )
    shared = len(set(ours["merges"]) & set(hf["merges"]))
    first_difference = next(
        (i for i, (a, b) in enumerate(zip(ours["merges"], hf["merges"], strict=False)) if a != b),
        min(len(ours["merges"]), len(hf["merges"])),
    )
    print(
        f"merges in common: {shared} of {len(ours['merges'])}; "
        f"identical prefix: {first_difference} merges"
    )
    print(f"time ratio ours / HF: {ours['seconds'] / hf['seconds']:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
