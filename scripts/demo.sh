#!/usr/bin/env bash
# The main job end to end on an embedded corpus (Python's help topics), with no downloads:
# corpus -> learned BPE vocabulary -> .bin/.idx dataset -> training sample indices -> model plan
# -> a small GPT trained in 2 processes (2 pipeline stages) under the deepspeed launcher
# -> the checkpoint reshaped to one process and exported to Hugging Face -> samples from it.
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
# The caches mds-train will read: 120 iterations x 16 samples; validation (120 // 40 + 1) x 2 x 16;
# test 2 x 16 (Megatron's counts), so training starts without building anything.
mds-index build --data-path "$out/corpus_text_document" --split 90,8,2 --seq-length 256 \
    --train-samples 1920 --valid-samples 128 --test-samples 32 --seed 1234
# Plan the model the trainer will use on this data: parameters, FLOPs per token, memory per GPU.
mds-model info --num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 \
    --vocab-size 4096 --micro-batch-size 4 --pipeline-model-parallel-size 2
# Train it: 2 CPU processes, one pipeline stage each (gloo), Megatron's flags; the loss falls from
# ~8.3 (ln 4096) and a checkpoint lands in $out/checkpoints for the next tools.
OMP_NUM_THREADS=1 deepspeed --num_gpus 2 --master_port "${MDS_DEMO_PORT:-29533}" --module mds_train \
    --pipeline-model-parallel-size 2 --num-layers 4 --hidden-size 256 --num-attention-heads 4 \
    --seq-length 256 --max-position-embeddings 256 --micro-batch-size 4 --global-batch-size 16 \
    --train-iters 120 --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 10 \
    --weight-decay 0.1 --clip-grad 1.0 --data-path "$out/corpus_text_document" --split 90,8,2 \
    --vocab-file "$out/vocab/vocab.json" --merge-file "$out/vocab/merges.txt" \
    --log-interval 10 --eval-interval 40 --eval-iters 2 --save "$out/checkpoints" --save-interval 60
# Reshape the 2-stage checkpoint for one process (TP=1, PP=1), checking its logits against the
# source's on a fixed batch, then export it as a Hugging Face GPT-2 folder (transformers loads it).
mds-merge-mp --load "$out/checkpoints" --save "$out/checkpoint-tp1-pp1" \
    --target-tensor-model-parallel-size 1 --target-pipeline-model-parallel-size 1 --verify
mds-merge-mp export-hf --load "$out/checkpoint-tp1-pp1" --save "$out/hf-gpt2"
# Samples from the model it trained: mds-generate reads the pipeline checkpoint with no model flags
# (meta.json names the shape and the vocabulary) and continues three prompts, one JSON line each.
printf '%s\n' "The built-in function" "A class definition" "for" >"$out/prompts.txt"
OMP_NUM_THREADS=1 mds-generate --load "$out/checkpoints" --sample-input-file "$out/prompts.txt" \
    --sample-output-file "$out/samples.jsonl" --max-new-tokens 24 --top-k 20 --temperature 0.7 \
    --seed 1 --device cpu
python -c 'import json, sys
for line in open(sys.argv[1]):
    record = json.loads(line)
    print(repr(record["prompt"]), "->", repr(record["completion"]))' "$out/samples.jsonl"
echo "demo finished: outputs in $out/ (checkpoint: $out/checkpoints/$(cat "$out/checkpoints/latest"))"
