#!/usr/bin/env bash
# Proves that every package under packages/ installs alone, as a user installs one tool:
#   1. in a fresh virtual environment, build each package's wheel with build isolation (build
#      requirements from the index, pinned by constraints.txt) into a wheelhouse;
#   2. for each package, a fresh virtual environment gets only that package, its declared siblings
#      found in the wheelhouse (`pip install --find-links WHEELHOUSE -c constraints.txt NAME`);
#      then `pip check`, an import of every module (an undeclared sibling import fails here) and
#      `--help` of every command it declares;
#   3. a small real job per tool, each tool run from its own environment: mds-tokenize on a tiny
#      jsonl with GPT-2's files, mds-index info/show on the result, its ids back through
#      `mds-tokenize decode`; a learned vocabulary written as tokenizer.json, refused with one line
#      without the hf extra, then (mds-tokenize[hf] installed) tokenized through PretrainedFromHF
#      into the same bytes as its vocab.json + merges.txt; mds-model info, mds-train for 2
#      iterations with a checkpoint, mds-merge-mp reshaping it (with optimizer state, verified)
#      and exporting it to HF, mds-generate sampling from the checkpoint, the reshaped one and
#      the HF export.
#      mds-common (no command) runs inside each of them.
# Everything happens in a temporary folder, removed at the end. Run by scripts/test.sh (CI).
# GPT-2's files come from $MDS_SHARED_DATA (default ../shared/data beside the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)
base=${MDS_BASE_PYTHON:-python3}
data=${MDS_SHARED_DATA:-$(dirname "$checkout")/shared/data}
constraints="$checkout/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Byte-compiling torch's thousands of files at install is a good share of the wall time, and these
# environments are thrown away.
export PIP_NO_COMPILE=1
start=$SECONDS

step() { printf 'check_wheels [%3ds]: %s\n' "$((SECONDS - start))" "$*"; }
fail() {
    printf 'check_wheels.sh: error: %s\n' "$*" >&2
    exit 1
}

[[ -f "$data/gpt2-vocab.json" && -f "$data/gpt2-merges.txt" ]] ||
    fail "GPT-2's vocab/merges not found in $data; set MDS_SHARED_DATA to the shared data folder"
work=$(mktemp -d "${TMPDIR:-/tmp}/mds-check-wheels.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A fresh virtual environment with the pinned pip (which has --group and --build-constraint).
new_venv() {
    "$base" -m venv "$1" || fail "'$base -m venv' failed (on Debian/Ubuntu: apt install python3-venv)"
    "$1/bin/python" -m pip install -q -c "$constraints" pip
}
# The distribution name and the console scripts of a package, read from its pyproject.toml.
dist_name() { sed -n 's/^name *= *"\([^"]*\)".*/\1/p' "$1/pyproject.toml" | head -n 1; }
dist_scripts() {
    awk '/^\[/ { in_scripts = ($0 == "[project.scripts]") }
         in_scripts && /=/ { sub(/ *=.*/, ""); gsub(/"/, ""); print }' "$1/pyproject.toml"
}

# Build from a copy of each package's source as a checkout has it (tracked and untracked files that
# git does not ignore): stale build/, *.egg-info and compiled files of a development install must
# not leak into the wheels.
copy_source() {
    if git -C "$checkout" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -C "$checkout" ls-files -z --cached --others --exclude-standard -- "$1" |
            while IFS= read -r -d '' file; do
                if [[ -e "$file" ]]; then # tracked but deleted in the work tree: left out
                    mkdir -p "$2/$(dirname "$file")" && cp -p "$file" "$2/$file"
                fi
            done
    else
        mkdir -p "$2/packages" && cp -rp "$1" "$2/packages/"
        rm -rf "$2/$1/build" "$2/$1"/src/*.egg-info
    fi
}

packages=()
for pyproject in packages/*/pyproject.toml; do packages+=("$(dirname "$pyproject")"); done

step "creating the build environment"
new_venv "$work/build-env"
for package in "${packages[@]}"; do
    step "building the wheel of $(dist_name "$package") with build isolation"
    copy_source "$package" "$work/source"
    "$work/build-env/bin/python" -m pip wheel -q --no-deps -c "$constraints" \
        --build-constraint "$constraints" -w "$work/wheelhouse" "$work/source/$package"
done

declare -A venv_of
for package in "${packages[@]}"; do
    name=$(dist_name "$package")
    venv="$work/venv-$name"
    venv_of[$name]=$venv
    step "installing $name alone into a fresh virtual environment"
    new_venv "$venv"
    "$venv/bin/python" -m pip install -q --find-links "$work/wheelhouse" -c "$constraints" \
        --build-constraint "$constraints" "$name"
    report=$("$venv/bin/python" -m pip check) || fail "pip check in the $name install: $report"
    siblings=$("$venv/bin/python" -m pip list --format freeze | sed -n 's/^\(mds-[^=]*\)==.*/\1/p')
    step "  mds distributions in it: $(echo "$siblings" | tr '\n' ' ')"
    module=$(basename "$(dirname "$(find "$package/src" -mindepth 2 -maxdepth 2 -name __init__.py |
        head -n 1)")")
    "$venv/bin/python" - "$module" <<'EOF'
import importlib, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(package.__path__, f"{sys.argv[1]}."):
    if not info.name.endswith("__main__"):  # running the CLI is the --help check below
        importlib.import_module(info.name)
EOF
    for script in $(dist_scripts "$package"); do
        "$venv/bin/$script" --help >/dev/null || fail "'$script --help' failed in the $name install"
        step "  $script --help works"
    done
done

# Small real jobs, each tool from its own environment; the files pass between them.
tool() {
    local name=$1 script=$2
    shift 2
    [[ -n "${venv_of[$name]:-}" ]] || fail "no package $name under packages/"
    "${venv_of[$name]}/bin/$script" "$@"
}
job="$work/job"
mkdir -p "$job"
printf '%s\n' '{"text": "Hello world!"}' '{"text": "It'"'"'s 2024."}' '{"text": ""}' >"$job/tiny.jsonl"
step "job: mds-tokenize on a 3-line jsonl with GPT-2's vocabulary"
tool mds-tokenize mds-tokenize --input "$job/tiny.jsonl" --output-prefix "$job/tiny" \
    --vocab-file "$data/gpt2-vocab.json" --merge-file "$data/gpt2-merges.txt" --append-eod
step "job: mds-index info and show on the result"
tool mds-indexed-data mds-index info "$job/tiny_text_document" | tee "$job/info.txt"
tool mds-indexed-data mds-index show "$job/tiny_text_document" --doc 0 | tee "$job/show.txt"
# "Hello world!" is [15496, 995, 0] in GPT-2, then the EOD 50256; the empty document is skipped.
grep -Eq "15496[ ,]+995[ ,]+0[ ,]+50256" "$job/show.txt" || fail "document 0 is not 'Hello world!' + EOD"
step "job: mds-index show's ids back to text with mds-tokenize decode"
tool mds-tokenize mds-tokenize decode --vocab-file "$data/gpt2-vocab.json" \
    --merge-file "$data/gpt2-merges.txt" <"$job/show.txt" | tee "$job/text.txt"
grep -q "Hello world!" "$job/text.txt" || fail "mds-tokenize decode did not give back 'Hello world!'"
step "job: a learned vocabulary as tokenizer.json, tokenized through PretrainedFromHF"
tool mds-tokenize mds-tokenize learn --input "$data/c4_demo.jsonl" --vocab-size 1000 \
    --output-dir "$job/learned" --tokenizer-json --workers 1
hf_flags=(--tokenizer-type PretrainedFromHF --tokenizer-name-or-path "$job/learned")
# Without the hf extra: one line naming it, exit 1.
if tool mds-tokenize mds-tokenize --input "$data/c4_demo.jsonl" --output-prefix "$job/hf" \
    "${hf_flags[@]}" 2>"$job/no-extra.txt"; then
    fail "PretrainedFromHF ran without the tokenizers library"
fi
grep -q "pip install 'mds-tokenize\[hf\]'" "$job/no-extra.txt" ||
    fail "no one-line hint to install mds-tokenize[hf]: $(cat "$job/no-extra.txt")"
step "  installing mds-tokenize[hf] (the tokenizers library) into the mds-tokenize environment"
"${venv_of[mds-tokenize]}/bin/python" -m pip install -q --find-links "$work/wheelhouse" \
    -c "$constraints" "mds-tokenize[hf]"
tool mds-tokenize mds-tokenize --input "$data/c4_demo.jsonl" --output-prefix "$job/hf" \
    "${hf_flags[@]}" --append-eod --workers 2
tool mds-tokenize mds-tokenize --input "$data/c4_demo.jsonl" --output-prefix "$job/bpe" \
    --vocab-file "$job/learned/vocab.json" --merge-file "$job/learned/merges.txt" --append-eod
for ext in bin idx; do
    cmp -s "$job/hf_text_document.$ext" "$job/bpe_text_document.$ext" ||
        fail "tokenizer.json and vocab.json + merges.txt give different .$ext files"
done
tool mds-indexed-data mds-index show "$job/hf_text_document" --doc 0 |
    tool mds-tokenize mds-tokenize decode "${hf_flags[@]}" >"$job/hf-text.txt"
# Document 0 is the corpus' first text and the EOD, decoded.
"${venv_of[mds-tokenize]}/bin/python" -c 'import json, sys
text = json.loads(open(sys.argv[1], encoding="utf-8").readline())["text"]
sys.exit(open(sys.argv[2], encoding="utf-8").read() != text + "<|endoftext|>\n")' \
    "$data/c4_demo.jsonl" "$job/hf-text.txt" ||
    fail "document 0 decoded through tokenizer.json is not the corpus' first text"
step "  same .bin/.idx as with vocab.json + merges.txt; document 0 decodes to its text"
step "job: mds-model info for a 2-layer GPT"
tool mds-model mds-model info --num-layers 2 --hidden-size 64 --num-attention-heads 2 \
    --seq-length 128 --vocab-size 512 --micro-batch-size 2
step "job: mds-train, 2 iterations of a tiny GPT on the dataset, one CPU process, a checkpoint"
OMP_NUM_THREADS=1 tool mds-train mds-train --num-layers 1 --hidden-size 16 \
    --num-attention-heads 2 --seq-length 4 --micro-batch-size 1 --train-iters 2 --lr 1e-3 \
    --data-path "$job/tiny_text_document" --vocab-file "$data/gpt2-vocab.json" \
    --merge-file "$data/gpt2-merges.txt" --split 100,0,0 --eval-iters 0 --log-interval 1 \
    --save "$job/checkpoints" 2>&1 | grep -v "^\[" | tee "$job/train.txt"
grep -q "saved checkpoint .*global_step2" "$job/train.txt" || fail "mds-train saved no checkpoint"
[[ $(cat "$job/checkpoints/latest") == global_step2 ]] || fail "latest does not name global_step2"
step "job: mds-merge-mp reshapes that checkpoint to TP=2 with its optimizer state, and exports it"
tool mds-checkpoint mds-merge-mp --load "$job/checkpoints" --save "$job/reshaped" \
    --target-tensor-model-parallel-size 2 --with-optimizer --verify | tee "$job/reshape.txt"
grep -q "verify: largest logit difference 0; loss on [0-9]* x [0-9]* random token ids (not text) [0-9.]* (the source's too)$" "$job/reshape.txt" || fail "mds-merge-mp --verify"
[[ -f "$job/reshaped/global_step2/zero/optimizer_state.pt" ]] || fail "no reshaped optimizer state"
tool mds-checkpoint mds-merge-mp export-hf --load "$job/reshaped" --save "$job/hf"
[[ -f "$job/hf/config.json" && -f "$job/hf/model.safetensors" ]] || fail "export-hf wrote no model"
[[ -f "$job/hf/vocab.json" && -f "$job/hf/merges.txt" ]] || fail "export-hf left the vocabulary out"
step "job: mds-generate samples from the checkpoint, the reshaped one and the HF export"
tool mds-generate mds-generate --load "$job/checkpoints" --prompt "Hello" --max-new-tokens 2 \
    --greedy --device cpu | tee "$job/sample.txt"
tool mds-generate mds-generate --load "$job/hf" --prompt "Hello" --max-new-tokens 2 --greedy \
    --device cpu >"$job/sample-hf.txt"
cmp -s "$job/sample.txt" "$job/sample-hf.txt" || fail "mds-generate: the HF export samples otherwise"
tool mds-generate mds-generate --load "$job/reshaped" --num-samples 2 --genfile \
    "$job/samples.jsonl" --max-new-tokens 3 --device cpu
[[ $(grep -c '"finished"' "$job/samples.jsonl") == 2 ]] || fail "mds-generate wrote no 2 samples"
for package in "${packages[@]}"; do
    case $(dist_name "$package") in
    mds-tokenize | mds-indexed-data | mds-model | mds-train | mds-checkpoint | mds-generate) ;;
    mds-common) step "mds-common has no command; every job above ran it from a tool's environment" ;;
    *) step "no job for $(dist_name "$package") yet: checked its install, imports and --help" ;;
    esac
done
step "every package built with isolation, installed alone and ran"
