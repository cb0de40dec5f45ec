"""mds-tokenize with `--tokenizer-type PretrainedFromHF` against a plain loop over the `tokenizers`
library's batch encoder, side by side in one run, on the shared corpora (openwebtext-1000.jsonl +
c4_demo.jsonl, 5.5 MB of jsonl).

Tokenizers, both built here with `tokenizers` (no download): GPT-2's vocab.json + merges.txt as a
byte-level BPE tokenizer.json, and (--wordpiece) a 70,000-entry WordPiece trained on the corpora.
Reference: read the jsonl, `json.loads` each line, `encode_batch_fast` 1,024 texts at a time, with
tokenizers' own thread pool (all cores) and with TOKENIZERS_PARALLELISM=false (one thread); no file
written. Ours: the whole command, `python -m mds_tokenize ... --append-eod --workers W` as a process
(interpreter start, imports and tokenizer load included), and `run()` in this process, for W = 1
and 2; its ids are checked against the reference's.

Run: python benchmarks/tokenize_hf.py [--repeats 3] [--wordpiece] [--shared-data DIR]
Rates are MB/s of jsonl input (10^6 bytes), each the best of --repeats runs; the runs take turns,
so that other jobs' load falls on all of them alike. MB/CPU-s divides by the CPU time (user +
system, all threads and child processes): what each costs, whatever else the machine runs.
"""

import argparse
import json
import logging
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPORA = ("openwebtext-1000.jsonl", "c4_demo.jsonl")
BATCH = 1024
WORKERS = (1, 2)


def cpu_seconds() -> float:
    """User + system time of this process (all its threads) and of its reaped children."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def best_rates(runs: dict, megabytes: float, repeats: int) -> dict:
    """(MB/s of wall time, MB per CPU-second) of each run, the best of `repeats`; the runs take
    turns (round robin) so that load from other jobs on the machine falls on all of them alike."""
    wall = dict.fromkeys(runs, float("inf"))
    cpu = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for label, function in runs.items():
            started, started_cpu = time.perf_counter(), cpu_seconds()
            function()
            wall[label] = min(wall[label], time.perf_counter() - started)
            cpu[label] = min(cpu[label], cpu_seconds() - started_cpu)
    return {label: (megabytes / wall[label], megabytes / cpu[label]) for label in runs}


@contextmanager
def tokenizers_parallelism(value: str):
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def _spin(count: int) -> int:
    total = 0
    for value in range(count):
        total += value
    return total


def parallel_control(repeats: int) -> float:
    """How much faster 2 CPU-bound processes finish 2 equal tasks than 1 process: 2.0 on an idle
    2-core machine, less when other jobs hold the cores (the most the worker rows can gain)."""
    tasks = [5_000_000] * 2
    best = {}
    for processes in (1, 2):
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                pool.map(_spin, tasks, chunksize=1)
                seconds.append(time.perf_counter() - started)
        best[processes] = min(seconds)
    return best[1] / best[2]


def gpt2_tokenizer_json(shared: Path, folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = json.loads((shared / "gpt2-vocab.json").read_text(encoding="utf-8"))
    lines = (shared / "gpt2-merges.txt").read_text(encoding="utf-8").split("\n")[1:-1]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(line.split()) for line in lines]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def wordpiece_tokenizer_json(corpus: Path, folder: Path) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=70_000,
        min_frequency=1,
        special_tokens=["[UNK]", "</s>"],
        show_progress=False,
    )
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]
    tokenizer.train_from_iterator(texts, trainer)
    folder.mkdir(parents=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def reference_ids(tokenizer, corpus: Path, eod: int) -> list[int]:
    """The plain loop: jsonl lines -> json.loads -> encode_batch_fast, EOD after each document."""
    ids: list[int] = []
    with open(corpus, encoding="utf-8") as handle:
        texts = [json.loads(line)["text"] for line in handle]
    for start in range(0, len(texts), BATCH):
        for encoding in tokenizer.encode_batch_fast(texts[start : start + BATCH]):
            if encoding.ids:
                ids.extend(encoding.ids)
                ids.append(eod)
    return ids


def measure(name: str, folder: Path, corpus: Path, scratch: Path, repeats: int) -> None:
    from mds_tokenize import load_tokenizer
    from mds_tokenize.config import TokenizeConfig
    from mds_tokenize.pipeline import run
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ours = load_tokenizer(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(folder))
    flags = ["--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", str(folder)]

    def reference_run(parallel: str):
        def encode():
            with tokenizers_parallelism(parallel):
                reference_ids(reference, corpus, ours.eod)

        return encode

    runs = {
        f"reference, encode_batch_fast on its thread pool ({os.cpu_count()} CPUs)": reference_run(
            "true"
        ),
        "reference, encode_batch_fast, TOKENIZERS_PARALLELISM=false": reference_run("false"),
    }
    for workers in WORKERS:
        command = [sys.executable, "-m", "mds_tokenize", "--input", str(corpus)]
        command += ["--output-prefix", str(scratch / f"{name}-cmd-{workers}"), *flags]
        command += ["--append-eod", "--workers", str(workers)]
        runs[f"mds-tokenize: `python -m mds_tokenize --workers {workers}`, a process"] = (
            lambda command=command: subprocess.run(command, check=True, capture_output=True)
        )
        config = TokenizeConfig(
            input=corpus,
            output_prefix=str(scratch / f"{name}-run-{workers}"),
            tokenizer_type="PretrainedFromHF",
            tokenizer_name_or_path=str(folder),
            append_eod=True,
            workers=workers,
        )
        runs[f"mds-tokenize: run() in this process, {workers} worker(s)"] = lambda c=config: run(c)
    rates = best_rates(runs, corpus.stat().st_size / 1e6, repeats)
    dtype = ours_dtype(ours)
    expected = reference_ids(reference, corpus, ours.eod)
    for workers in WORKERS:
        written = np.fromfile(f"{scratch / f'{name}-cmd-{workers}'}_text_document.bin", dtype=dtype)
        assert written.tolist() == expected, f"ids differ with {workers} workers"

    print(f"{name}: {ours.vocab_size:,} tokens, .bin {dtype}; the .bin ids equal the reference's")
    fastest = max(rate for label, (rate, _) in rates.items() if label.startswith("reference"))
    print(f"  {'':<66} {'MB/s':>6}  MB/CPU-s")
    for label, (rate, per_cpu) in rates.items():
        ratio = (
            "" if label.startswith("reference") else f"   / fastest reference {rate / fastest:.2f}x"
        )
        print(f"  {label:<66} {rate:6.2f}  {per_cpu:6.2f}{ratio}")


def ours_dtype(tokenizer) -> str:
    from mds_indexed_data import best_fitting_dtype

    return np.dtype(best_fitting_dtype(tokenizer.vocab_size)).name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument(
        "--wordpiece", action="store_true", help="also a 70,000-entry WordPiece (int32 .bin)"
    )
    parser.add_argument(
        "--shared-data",
        type=Path,
        default=Path(os.environ.get("MDS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data")),
    )
    args = parser.parse_args()
    logging.disable(logging.INFO)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        corpus = scratch / "both.jsonl"
        corpus.write_bytes(b"".join((args.shared_data / name).read_bytes() for name in CORPORA))
        print(
            f"input: {' + '.join(CORPORA)}: {corpus.stat().st_size / 1e6:.2f} MB of jsonl; "
            f"{os.cpu_count()} CPUs; best of {args.repeats}, all measured in this run"
        )
        control = parallel_control(args.repeats)
        measure("GPT-2 BPE tokenizer.json", gpt2_tokenizer_json(args.shared_data, scratch / "g"),
                corpus, scratch, args.repeats)  # fmt: skip
        if args.wordpiece:
            folder = wordpiece_tokenizer_json(corpus, scratch / "w")
            measure("WordPiece tokenizer.json", folder, corpus, scratch, args.repeats)
        print(
            f"control: 2 CPU-bound processes finish 2 tasks {control:.2f}x / "
            f"{parallel_control(args.repeats):.2f}x (before / after) faster than 1 process "
            "(2.0x on idle cores; less means other jobs held them)"
        )


if __name__ == "__main__":
    main()
