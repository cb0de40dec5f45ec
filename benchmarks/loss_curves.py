"""Loss curves kept by `benchmarks/train.py --losses-json`, compared across calls: every variant
against a base variant (`default`, the bf16 step, unless --base says otherwise) at the seeds both
ran.

The files are read together: runs of one variant at one seed from several files (two calls' bf16
runs) are averaged into that seed's curve. Then, as train.py compares the variants of one call:
the seeds' mean curves every tenth of the run, the largest relative difference of their
10-iteration means after the first 10 iterations, each seed's own pair and the standard error of
the seed-paired differences at the worst window. Where a variant ran more than once at a seed, its
first two runs there are compared the same way: the spread one run of it carries (the bf16 step is
not bitwise deterministic, and a 300-iteration run amplifies that).

Usage: python benchmarks/loss_curves.py LOSSES.json [LOSSES.json ...] [--base default]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from train import mean_curve, paired_seeds, print_curves

Curve = dict[int, float]


class LossesError(ValueError):
    """A losses file this script can't read, with what to do."""


def read_runs(paths: list[Path]) -> dict[str, dict[int | None, list[Curve]]]:
    """Every file's runs, by variant and seed, in the order given."""
    runs: dict[str, dict[int | None, list[Curve]]] = {}
    for path in paths:
        try:
            variants = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise LossesError(f"{path}: not a readable JSON file ({error})") from None
        if not isinstance(variants, dict):
            raise LossesError(f"{path}: not a --losses-json file (no variants at its top level)")
        for variant, variant_runs in variants.items():
            for run in variant_runs if isinstance(variant_runs, list) else [None]:
                if not isinstance(run, dict) or set(run) != {"seed", "losses"}:
                    raise LossesError(
                        f"{path}: {variant}'s runs carry no seeds; write the file again with "
                        "benchmarks/train.py --losses-json ({variant: [{seed, losses}]})"
                    )
                try:
                    curve = {int(i): float(loss) for i, loss in run["losses"].items()}
                except (AttributeError, TypeError, ValueError):
                    raise LossesError(
                        f"{path}: {variant}'s losses at seed {run['seed']} are not "
                        "{iteration: loss}"
                    ) from None
                runs.setdefault(variant, {}).setdefault(run["seed"], []).append(curve)
    return runs


def seed_curves(by_seed: dict[int | None, list[Curve]]) -> list[dict]:
    """One curve per seed (its runs' mean), as train.py's paired_seeds takes them."""
    return [{"seed": seed, "losses": mean_curve(curves)} for seed, curves in by_seed.items()]


def seeds_text(seeds: list) -> str:
    return ", ".join(str(seed) for seed in seeds)


def compare(name: str, ours: list[dict], base_name: str, base: list[dict]) -> None:
    """`ours` against `base` at the seeds both have: the seeds' mean curves, their worst window,
    each seed's pair."""
    base_by_seed = {run["seed"]: run for run in base}
    ours = [run for run in ours if run["seed"] in base_by_seed]
    if not ours:
        print(f"{name}: no seed in common with {base_name}: nothing to compare")
        return
    print(f"{name} against {base_name} at seeds {seeds_text([run['seed'] for run in ours])}")
    theirs = mean_curve([base_by_seed[run["seed"]]["losses"] for run in ours])
    print_curves(name, mean_curve([run["losses"] for run in ours]), base_name, theirs)
    print(f"  {paired_seeds(ours, [base_by_seed[run['seed']] for run in ours])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="train.py --losses-json files")
    parser.add_argument("--base", default="default", help="the variant compared against")
    args = parser.parse_args()
    try:
        runs = read_runs(args.files)
    except LossesError as error:
        sys.exit(f"error: {error}")
    if args.base not in runs:
        sys.exit(
            f"error: no {args.base} runs in {', '.join(map(str, args.files))}; "
            f"--base one of {', '.join(runs)}"
        )
    for variant, by_seed in runs.items():
        repeated = {seed: curves[:2] for seed, curves in by_seed.items() if len(curves) > 1}
        if repeated:
            first = [{"seed": seed, "losses": curves[0]} for seed, curves in repeated.items()]
            second = [{"seed": seed, "losses": curves[1]} for seed, curves in repeated.items()]
            compare(f"{variant} (second runs)", second, f"{variant} (first runs)", first)
    base = seed_curves(runs[args.base])
    for variant, by_seed in runs.items():
        if variant != args.base:
            compare(variant, seed_curves(by_seed), args.base, base)


if __name__ == "__main__":
    main()
