"""Speed of mds-index's Cython builders against numpy's shuffle of an array of the same length.

Synthetic dataset: 10 million documents of 1..999 tokens (about 5 billion tokens), seq length 2048,
one full epoch of samples. Megatron shuffles doc_idx (one entry per document) right before building
sample_idx, and shuffles shuffle_idx (one entry per sample) next to the blend, so those shuffles are
the yardsticks: sample_idx vs shuffling 10M doc ids, blending vs shuffling as many entries as the
blend has samples. Each time is the best of --repeats runs, all measured in this one process.

    python3 benchmarks/index.py [--num-documents 10000000] [--seq-length 2048] [--repeats 3]
"""

import argparse
import time

import numpy as np
from mds_indexed_data import helpers
from mds_indexed_data.blending import build_blending_indices


def best_time(function, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def numpy_shuffle_time(length: int, dtype, repeats: int, seed: int) -> float:
    array = np.arange(length, dtype=dtype)
    rng = np.random.RandomState(seed)
    return best_time(lambda: rng.shuffle(array), repeats)


def report(name: str, ours: float, shuffle: float, length: int) -> None:
    print(
        f"{name:34} {ours:8.3f} s   numpy shuffle of {length:,}: {shuffle:8.3f} s   "
        f"ratio ours/shuffle {ours / shuffle:6.3f} ({'faster' if ours < shuffle else 'SLOWER'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-documents", type=int, default=10_000_000, help="documents")
    parser.add_argument("--seq-length", type=int, default=2048, help="tokens per sample L")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (best kept)")
    parser.add_argument("--seed", type=int, default=1234, help="numpy RandomState seed")
    parser.add_argument(
        "--blend-components", type=int, nargs="+", default=[2, 10, 300], help="datasets per blend"
    )
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(1, 1000, size=args.num_documents, dtype=np.int32)
    tokens = int(sizes.sum(dtype=np.int64))
    num_samples = (tokens - 1) // args.seq_length
    print(
        f"dataset: {args.num_documents:,} documents, {tokens:,} tokens; seq length "
        f"{args.seq_length}; one epoch = {num_samples:,} samples"
    )

    doc_idx = np.arange(args.num_documents, dtype=np.int32)
    np.random.RandomState(args.seed).shuffle(doc_idx)
    sample_time = best_time(
        lambda: helpers.build_sample_idx(sizes, doc_idx, args.seq_length, num_samples, np.int32),
        args.repeats,
    )
    shuffle_docs = numpy_shuffle_time(args.num_documents, np.int32, args.repeats, args.seed)
    shuffle_samples = numpy_shuffle_time(num_samples, np.uint32, args.repeats, args.seed)
    # "An array of the same length" read both ways: the documents it walks, the samples it writes.
    report("sample_idx (Cython)", sample_time, shuffle_docs, args.num_documents)
    report("sample_idx (Cython)", sample_time, shuffle_samples, num_samples)

    for num_components in args.blend_components:
        weights = rng.random(num_components) + 0.1
        weights = list(weights / weights.sum())
        blend_time = best_time(
            lambda w=weights: build_blending_indices(w, num_samples), args.repeats
        )
        report(
            f"blending, {num_components} datasets (Cython)",
            blend_time,
            shuffle_samples,
            num_samples,
        )


if __name__ == "__main__":
    main()
