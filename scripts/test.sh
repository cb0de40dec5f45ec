#!/usr/bin/env bash
# Installs the workspace, lints it, and runs the CPU test suite (GPU-only tests, marked `gpu`, run
# on a GPU machine with `python3 -m pytest -m gpu`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m pytest -m "not gpu" "$@"
