#!/usr/bin/env bash
# The main job end to end on an embedded corpus (Python's help topics), with no downloads:
# corpus -> learned BPE vocabulary -> .bin/.idx dataset -> training sample indices -> model plan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# Run the tools and Python from the environment install.sh used (.venv/ or the active one).
PATH="$(dirname "$(bash scripts/install.sh --print-python)"):$PATH"
out=${MDS_DEMO_DIR:-demo-output}
rm -rf "$out" && mkdir -p "$out"

python scripts/demo_corpus.py --output "$out/corpus.jsonl"
mds-tokenize learn --input "$out/corpus.jsonl" --vocab-size 4096 --output-dir "$out/vocab"
mds-tokenize --input "$out/corpus.jsonl" --output-prefix "$out/corpus" \
    --vocab-file "$out/vocab/vocab.json" --merge-file "$out/vocab/merges.txt" --append-eod --workers 2
mds-index info "$out/corpus_text_document"
mds-index build --data-path "$out/corpus_text_document" --split 949,50,1 --seq-length 256 \
    --train-samples 2000 --valid-samples 64 --test-samples 0 --seed 1234
# Plan the model the trainer will use on this data: parameters, FLOPs per token, memory per GPU.
mds-model info --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 \
    --vocab-size 4096 --micro-batch-size 8
echo "demo finished: outputs in $out/"
