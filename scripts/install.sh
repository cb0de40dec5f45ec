#!/usr/bin/env bash
# Installs every mds package in editable mode plus the development tools, all pinned by
# constraints.txt. Idempotent: rerunning it rebuilds the Cython extensions and changes nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m pip install -q -c constraints.txt pip setuptools Cython numpy
packages=()
for pyproject in packages/*/pyproject.toml; do packages+=(-e "$(dirname "$pyproject")"); done
# No build isolation: the extensions build against the pinned Cython installed above.
python3 -m pip install -q -c constraints.txt --no-build-isolation --group dev "${packages[@]}"
