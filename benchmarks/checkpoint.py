"""mds-merge-mp on a randomly initialised GPT-2 345M checkpoint, TP=2 x PP=2 -> TP=1 x PP=1 on CPU,
against `cp -r` of the same bytes in the same run: wall time (target: within 2x of cp) and peak
RSS of the reshaping process (target: under 1.5 GB, about a layer above the bare interpreter).

The source is written by mds-checkpoint's own writer from random tensors, one part at a time
(24 layers, hidden 1024, 16 heads, vocab 50257 padded for TP=2, seq 1024), in --dtype. Each
command runs as a child process; its peak RSS is its own (`os.wait4`). Every round runs `cp -r`,
then fsyncs the copied files (the durable copy), then the reshape; the whole machine is synced
before each timed command, so none of them pays for another's dirty pages, and all read the
source from the page cache. The best of --rounds is kept for each (the VM is shared: noise only
ever adds time).

The reshape's output is durable when it returns (fsynced, then renamed into place: an
interrupted run never leaves a half-written checkpoint), so the like-for-like reference is
`cp -r` followed by an fsync of every copied file; the ratio to the bare `cp -r` (whose bytes may
still be only in the page cache when it exits) is printed beside it.

    python3 benchmarks/checkpoint.py [--dtype float32] [--work /tmp/mds-checkpoint-bench]
        [--rounds 3] [--keep]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from mds_checkpoint import CheckpointMeta, Parallel, Progress, tag_for

# The package's own writer (internal: only its benchmark and tests write a checkpoint with it)
from mds_checkpoint.arrays import as_array
from mds_checkpoint.output import output_meta, target_config, write_meta
from mds_checkpoint.source import part_names
from mds_checkpoint.writer import CheckpointWriter
from mds_model import GPTConfig

LAYER = (
    ("input_layernorm.weight", "h"), ("input_layernorm.bias", "h"),
    ("self_attention.query_key_value.weight", "3h,h"),
    ("self_attention.query_key_value.bias", "3h"),
    ("self_attention.dense.weight", "h,h"), ("self_attention.dense.bias", "h"),
    ("post_attention_layernorm.weight", "h"), ("post_attention_layernorm.bias", "h"),
    ("mlp.dense_h_to_4h.weight", "4h,h"), ("mlp.dense_h_to_4h.bias", "4h"),
    ("mlp.dense_4h_to_h.weight", "h,4h"), ("mlp.dense_4h_to_h.bias", "h"),
)  # fmt: skip


def _shape(spec: str, h: int) -> tuple[int, ...]:
    sizes = {"h": h, "3h": 3 * h, "4h": 4 * h}
    return tuple(sizes[s] for s in spec.split(","))


def write_source(folder: Path, config: GPTConfig, *, tp: int, pp: int) -> None:
    """A random TP/PP checkpoint in mds-train's layout, written part by part."""
    generator = torch.Generator().manual_seed(1234)
    dtype, h = config.torch_dtype, config.hidden_size

    def random(*shape):
        return as_array((torch.randn(shape, generator=generator) * 0.02).to(dtype))

    tag = tag_for(100)
    with CheckpointWriter(
        folder / tag, config=config, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp
    ) as writer:
        for part in part_names(config.num_layers):
            if part == "embedding":
                tensors = {
                    "embedding.word_embeddings.weight": random(config.padded_vocab_size, h),
                    "embedding.position_embeddings.weight": random(config.max_positions, h),
                }
            elif part == "final":
                tensors = {"final_layernorm.weight": random(h), "final_layernorm.bias": random(h)}
            else:
                tensors = {f"{part}.{name}": random(*_shape(spec, h)) for name, spec in LAYER}
            writer.write_part(tensors)
        progress = {"iteration": 100, "consumed_train_samples": 51200}
        writer.finish(progress)
    base = CheckpointMeta(model={}, parallel=Parallel(), progress=Progress.from_dict(progress))
    meta = output_meta(
        base,
        config,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        tag=tag,
        reshaped={"from": "random"},
        optimizer=None,
    )
    write_meta(folder / tag, meta)
    (folder / "latest").write_text(tag)


# Runs a command and writes its wall seconds and peak RSS to the file argv[1]. The command's
# parent must be small: Linux starts a process's ru_maxrss at its parent's RSS when it forks and
# execs, so a command spawned straight from this benchmark (torch and the source's tensors,
# hundreds of MiB) would report this process's peak instead of its own.
_SPAWNER = """
import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as file:
    file.write(f"{time.perf_counter() - start} {usage.ru_maxrss}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MiB, stdout) of one child process."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as report:
        result = subprocess.run(
            [sys.executable, "-S", "-c", _SPAWNER, report.name, *command],
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed")
        seconds, peak = report.read().split()
    return float(seconds), int(peak) / 1024, result.stdout  # ru_maxrss: KiB on Linux


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def fsync_files(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as file:
                os.fsync(file.fileno())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/mds-checkpoint-bench"))
    parser.add_argument("--num-layers", type=int, default=24, help="345M: 24")
    parser.add_argument("--rounds", type=int, default=3, help="best of this many runs of each")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    model = GPTConfig(
        num_layers=args.num_layers, hidden_size=1024, num_attention_heads=16, vocab_size=50257,
        seq_length=1024, params_dtype=args.dtype,
    )  # fmt: skip
    source = args.work / "source"
    start = time.perf_counter()
    write_source(
        source,
        target_config(model, tensor_model_parallel_size=2, pipeline_model_parallel_size=2),
        tp=2,
        pp=2,
    )
    size = folder_bytes(source)
    print(
        f"source: random GPT-2 345M ({args.num_layers} layers) at TP=2 PP=2, {args.dtype}, "
        f"{size / 2**30:.2f} GiB in {len(list((source / 'global_step100').iterdir()))} files "
        f"(written in {time.perf_counter() - start:.1f} s)"
    )
    python = sys.executable
    baseline = run_measured([python, "-c", "import mds_checkpoint.cli, mds_checkpoint.reshape"])[1]
    copy, out = args.work / "copy", args.work / "out"
    cp_times, durable_times, reshapes = [], [], []
    for _ in range(args.rounds):
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        os.sync()
        cp_times.append(run_measured(["cp", "-r", str(source), str(copy)])[0])
        start = time.perf_counter()
        fsync_files(copy)
        durable_times.append(cp_times[-1] + time.perf_counter() - start)
        os.sync()
        reshapes.append(
            run_measured(
                [python, "-m", "mds_checkpoint", "--load", str(source), "--save", str(out),
                 "--target-tensor-model-parallel-size", "1",
                 "--target-pipeline-model-parallel-size", "1"]
            )
        )  # fmt: skip
    cp_time, durable_cp = min(cp_times), min(durable_times)
    process = min(seconds for seconds, _, _ in reshapes)
    inside = min(float(re.search(r" in ([0-9.]+) s", text).group(1)) for _, _, text in reshapes)
    peak = max(rss for _, rss, _ in reshapes)
    out_size = folder_bytes(out)
    print(f"best of {args.rounds} rounds (seconds per round in brackets)")

    def row(label: str, seconds: float, every: list[float]) -> None:
        rounds = " ".join(f"{s:.2f}" for s in every)
        print(
            f"{label:32s} {seconds:6.2f} s  {seconds / durable_cp:5.2f}x cp+fsync "
            f"{seconds / cp_time:5.2f}x cp  [{rounds}]"
        )

    row("cp -r", cp_time, cp_times)
    row("cp -r, then fsync its files", durable_cp, durable_times)
    row("mds-merge-mp process", process, [seconds for seconds, _, _ in reshapes])
    insides = [float(re.search(r" in ([0-9.]+) s", text).group(1)) for _, _, text in reshapes]
    row("  the reshape inside it", inside, insides)
    print(
        f"target: the process within 2x of copying the same {out_size / 2**30:.2f} GiB; judged "
        f"against cp + fsync, since the reshape's output is fsynced: {process / durable_cp:.2f}x "
        f"({'met' if process <= 2 * durable_cp else 'not met'}); against the bare cp "
        f"{process / cp_time:.2f}x. The process's time beyond the reshape is starting Python "
        "and its imports (numpy, not torch)."
    )
    item = 4 if args.dtype == "float32" else 2
    layer = (12 * 1024 * 1024 + 13 * 1024) * item / 2**20
    embedding = model.padded_vocab_size * 1024 * item / 2**20
    print(
        f"peak RSS: mds-merge-mp {peak:.0f} MiB (target < 1536); the interpreter with its "
        f"imports {baseline:.0f} MiB; a transformer layer is {layer:.0f} MiB, the word "
        f"embeddings (the largest part) {embedding:.0f} MiB"
    )
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
