"""mds-model benchmarks on one GPU: the kernels (model_kernels.py), then the 345M training step
(model_step.py).

Each part prints its own table with ratios against its reference measured in the same call.
Usage: python benchmarks/model.py [--reference ../shared/bench/reference_gpt.py]
       [--skip-kernels] [--skip-step]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", default=None, help="reference_gpt.py for the step benchmark")
    parser.add_argument("--skip-kernels", action="store_true", help="do not run model_kernels.py")
    parser.add_argument("--skip-step", action="store_true", help="do not run model_step.py")
    args, rest = parser.parse_known_args()
    status = 0
    if not args.skip_kernels:
        status |= subprocess.call([sys.executable, str(HERE / "model_kernels.py")])
    if not args.skip_step:
        step = [sys.executable, str(HERE / "model_step.py"), *rest]
        if args.reference:
            step += ["--reference", args.reference]
        status |= subprocess.call(step)
    sys.exit(status)


if __name__ == "__main__":
    main()
