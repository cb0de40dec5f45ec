#!/usr/bin/env bash
# Installs every mds package (editable) and the development tools, pinned by constraints.txt, into
# a virtual environment: the active one ($VIRTUAL_ENV) or else `.venv/` in the checkout, created on
# first use. Never into the system's Python, which may refuse (PEP 668) or would be polluted.
# Idempotent: a rerun reuses the environment, rebuilds the Cython extensions, changes nothing else.
#
#   bash scripts/install.sh                 install (one line per step on stdout)
#   bash scripts/install.sh --print-python  only print the interpreter it would install into
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)

# The environment to install into: the active virtual environment, else the checkout's .venv.
target_env() {
    if [[ -n "${VIRTUAL_ENV:-}" ]]; then
        printf '%s\n' "$VIRTUAL_ENV"
    else
        printf '%s\n' "$checkout/.venv"
    fi
}

env_dir=$(target_env)
python="$env_dir/bin/python"
if [[ "${1:-}" == "--print-python" ]]; then
    printf '%s\n' "$python"
    exit 0
fi
if [[ $# -gt 0 ]]; then
    echo "install.sh: error: unknown argument '$1' (the only option is --print-python)" >&2
    exit 2
fi

step() { printf 'install: %s\n' "$*"; }
fail() {
    printf 'install.sh: error: %s\n' "$*" >&2
    exit 1
}

if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    [[ -x "$python" ]] || fail "VIRTUAL_ENV=$VIRTUAL_ENV has no bin/python; activate a working \
virtual environment, or run 'deactivate' to install into $checkout/.venv"
    step "using the active virtual environment $VIRTUAL_ENV"
elif "$python" -m pip --version >/dev/null 2>&1; then
    step "reusing .venv ($("$python" --version 2>&1))"
else
    # A .venv without a working pip is the remains of a failed creation (e.g. Debian without
    # python3-venv): start again rather than install into it.
    base=${MDS_BASE_PYTHON:-python3}
    command -v "$base" >/dev/null || fail "no '$base' on PATH; install Python >= 3.10"
    "$base" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
        fail "$("$base" --version 2>&1) is too old; mds needs Python >= 3.10 (set MDS_BASE_PYTHON)"
    step "creating .venv with $(command -v "$base") ($("$base" --version 2>&1))"
    rm -rf .venv
    if ! "$base" -m venv .venv; then
        rm -rf .venv
        fail "'$base -m venv .venv' failed; on Debian/Ubuntu install the venv module \
('sudo apt install python3-venv'), then rerun"
    fi
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
pip=("$python" -m pip install -q -c constraints.txt)
step "installing pip, setuptools, Cython and numpy (build tools) ..."
"${pip[@]}" pip setuptools Cython numpy
step "installing torch (the version pinned in constraints.txt; a CPU wheel where pip finds one) ..."
"${pip[@]}" torch
step "installing the dev tools (pytest, ruff, tiktoken, tokenizers, triton) ..."
"${pip[@]}" --group dev
editable=()
names=()
for pyproject in packages/*/pyproject.toml; do
    editable+=(-e "$(dirname "$pyproject")")
    names+=("$(basename "$(dirname "$pyproject")")")
done
step "building Cython extensions; installing ${names[*]} (editable) and their dependencies ..."
# No build isolation: the extensions build against the pinned Cython installed above.
"${pip[@]}" --no-build-isolation "${editable[@]}"
step "done: tools installed in $env_dir; put them on PATH with 'source $env_dir/bin/activate'"
