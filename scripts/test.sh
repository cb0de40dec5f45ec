#!/usr/bin/env bash
# Installs the workspace and runs the CPU test suite (GPU-only tests run on the device machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 -m pytest -m "not gpu" "$@"
