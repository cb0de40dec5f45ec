#!/usr/bin/env bash
# Installs the workspace, lints it, runs the CPU test suite (GPU-only tests, marked `gpu`, run on a
# GPU machine with `python -m pytest -m gpu`), then proves that every package builds and installs
# alone (scripts/check_wheels.sh). Arguments go to pytest; with arguments only pytest runs after
# the lint, for a quick subset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Run ruff, pytest and the tools from the environment install.sh used (.venv/ or the active one).
PATH="$(dirname "$(bash scripts/install.sh --print-python)"):$PATH"
python -m ruff check .
python -m ruff format --check .
python -m pytest -m "not gpu" --durations=25 "$@"
if [[ $# -gt 0 ]]; then
    echo "test.sh: pytest arguments given, so scripts/check_wheels.sh was not run"
else
    bash scripts/check_wheels.sh
fi
