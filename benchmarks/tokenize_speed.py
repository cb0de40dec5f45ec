"""mds-tokenize speed against tiktoken, side by side in one process, on the shared corpora
(openwebtext-1000.jsonl + c4_demo.jsonl, 5.5 MB): single-core encode against tiktoken's
`encode_ordinary` and its batched, threaded `encode_ordinary_batch(texts, num_threads=N)`, and the
whole jsonl -> .bin/.idx command with 1 and N workers.

Run: python benchmarks/tokenize_speed.py [--repeats 5] [--threads N] [--shared-data DIR]
Rates are MB/s of UTF-8 text (encode) or of jsonl input (whole command), MB = 10^6 bytes; each
figure is the best of --repeats runs. Word caches are cleared before every encode run. The output
separates the figures measured in this run from the one quoted (Megatron's preprocess_data.py).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPORA = ("openwebtext-1000.jsonl", "c4_demo.jsonl")
# Quoted, not measured here (it needs a Megatron-DeepSpeed checkout): bigscience's
# tools/preprocess_data.py with 2 workers on the same corpora, measured on these 2-core machines.
MEGATRON_PREPROCESS_MBS = 2.4


def best_seconds(function, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def tiktoken_gpt2(shared_data: Path):
    import tiktoken
    from mds_tokenize.byte_level import END_OF_TEXT, GPT2_SPLIT_PATTERN, unicode_to_bytes

    vocab = json.loads((shared_data / "gpt2-vocab.json").read_text(encoding="utf-8"))
    byte_of = unicode_to_bytes()
    ranks = {
        bytes(byte_of[c] for c in token): i for token, i in vocab.items() if token != END_OF_TEXT
    }
    return tiktoken.Encoding(
        "gpt2-from-shared-files",
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={END_OF_TEXT: vocab[END_OF_TEXT]},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="tiktoken threads and mds-tokenize workers for the parallel figures (default: CPUs)",
    )
    parser.add_argument(
        "--shared-data",
        type=Path,
        default=Path(os.environ.get("MDS_SHARED_DATA", REPO_ROOT.parent / "shared" / "data")),
    )
    args = parser.parse_args()

    from mds_tokenize import GPT2BPETokenizer
    from mds_tokenize.config import TokenizeConfig
    from mds_tokenize.pipeline import run

    shared = args.shared_data
    texts = [
        json.loads(line)["text"]
        for name in CORPORA
        for line in (shared / name).read_text(encoding="utf-8").splitlines()
    ]
    text_mb = sum(len(text.encode("utf-8")) for text in texts) / 1e6
    tokenizer = GPT2BPETokenizer.from_files(shared / "gpt2-vocab.json", shared / "gpt2-merges.txt")
    reference = tiktoken_gpt2(shared)
    ours_ids = tokenizer.encode_batch(texts)[0].tolist()
    assert ours_ids == [i for doc in reference.encode_ordinary_batch(texts) for i in doc], (
        "ids differ"
    )

    def ours_encode():
        tokenizer._core.clear_cache()
        tokenizer.encode_batch(texts)

    threads = args.threads
    ours = text_mb / best_seconds(ours_encode, args.repeats)
    tiktoken_1 = text_mb / best_seconds(
        lambda: [reference.encode_ordinary(t) for t in texts], args.repeats
    )
    tiktoken_batch_1 = text_mb / best_seconds(
        lambda: reference.encode_ordinary_batch(texts, num_threads=1), args.repeats
    )
    tiktoken_batch_n = text_mb / best_seconds(
        lambda: reference.encode_ordinary_batch(texts, num_threads=threads), args.repeats
    )

    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        corpus = scratch / "both.jsonl"
        corpus.write_bytes(b"".join((shared / name).read_bytes() for name in CORPORA))
        corpus_mb = corpus.stat().st_size / 1e6
        big = scratch / "both-x8.jsonl"
        big.write_bytes(corpus.read_bytes() * 8)

        def whole_run(path: Path, workers: int):
            config = TokenizeConfig(
                input=path,
                output_prefix=str(scratch / "out"),
                vocab_file=shared / "gpt2-vocab.json",
                merge_file=shared / "gpt2-merges.txt",
                append_eod=True,
                workers=workers,
            )
            return lambda: run(config)  # builds its own tokenizer: the command's real fixed costs

        import logging

        logging.disable(logging.INFO)
        run_1 = corpus_mb / best_seconds(whole_run(corpus, 1), args.repeats)
        run_n = corpus_mb / best_seconds(whole_run(corpus, threads), args.repeats)
        run_n_big = 8 * corpus_mb / best_seconds(whole_run(big, threads), max(1, args.repeats // 2))
        command = [
            sys.executable,
            "-m",
            "mds_tokenize",
            "--input",
            str(corpus),
            "--output-prefix",
            str(scratch / "cmd"),
            "--vocab-file",
            str(shared / "gpt2-vocab.json"),
            "--merge-file",
            str(shared / "gpt2-merges.txt"),
            "--append-eod",
            "--workers",
            str(threads),
        ]
        process = corpus_mb / best_seconds(
            lambda: subprocess.run(command, check=True, capture_output=True), args.repeats
        )

    print(
        f"input: {' + '.join(CORPORA)}: {text_mb:.2f} MB of text, {corpus_mb:.2f} MB of "
        f"jsonl, {len(texts)} docs; {os.cpu_count()} CPUs, --threads {threads}"
    )
    print(f"measured in this run, best of {args.repeats}:")
    print(f"  encode, 1 core   mds-tokenize encode_batch                {ours:6.1f} MB/s")
    for label, rate in (
        ("tiktoken encode_ordinary, 1 thread", tiktoken_1),
        ("tiktoken encode_ordinary_batch, num_threads=1", tiktoken_batch_1),
        (f"tiktoken encode_ordinary_batch, num_threads={threads}", tiktoken_batch_n),
    ):
        print(
            f"                   {label:<48} {rate:6.1f} MB/s   ours 1 core / it {ours / rate:.2f}x"
        )
    print(
        f"  jsonl -> .bin/.idx, run() (tokenizer build and cold caches included):\n"
        f"                   1 worker  {run_1:6.1f} MB/s\n"
        f"                   {threads} workers {run_n:6.1f} MB/s   / tiktoken batch "
        f"num_threads={threads} {run_n / tiktoken_batch_n:.2f}x\n"
        f"                   {threads} workers, 8 copies ({8 * corpus_mb:.0f} MB) "
        f"{run_n_big:6.1f} MB/s"
    )
    print(
        f"  `python -m mds_tokenize --workers {threads}` as a process (interpreter start and "
        f"imports included) {process:6.1f} MB/s"
    )
    print("quoted, not measured in this run:")
    print(
        f"  Megatron preprocess_data.py, 2 workers, same corpora, 2-core machine: "
        f"{MEGATRON_PREPROCESS_MBS} MB/s; run() with {threads} workers / it "
        f"{run_n / MEGATRON_PREPROCESS_MBS:.1f}x"
    )


if __name__ == "__main__":
    main()
