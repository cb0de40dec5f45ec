#!/usr/bin/env bash
# Writes this folder's files with the checked-out tools: a learned vocabulary (also as
# tokenizer.json), a tokenized dataset and a merge of it (their sidecars), an mds-train checkpoint
# (plain engine, ZeRO-1, at iteration 4) and a 2-stage pipeline one, its reshape to Megatron's layout and its Hugging Face
# export, and expected.json (the losses of the run continued to iteration 6, and the checkpoint's
# logits on a fixed batch). test_written_files.py reads them with the current code: a format
# change that stops reading them is a break for every user holding such files.
# Run from the repository root: bash tests/e2e/written_files/make.sh OUT
set -euo pipefail
out=${1:?usage: make.sh OUT}
rm -rf "$out" && mkdir -p "$out"
export OMP_NUM_THREADS=1
python - "$out/corpus.jsonl" <<'PY'
import json, sys
with open("../shared/data/c4_demo.jsonl", encoding="utf-8") as source, open(sys.argv[1], "w", encoding="utf-8") as out:
    for _, line in zip(range(60), source):
        out.write(json.dumps({"text": json.loads(line)["text"][:600]}) + "\n")
PY
mds-tokenize learn --input "$out/corpus.jsonl" --vocab-size 384 --output-dir "$out/vocab" --tokenizer-json --workers 1
mds-tokenize --input "$out/corpus.jsonl" --output-prefix "$out/corpus" \
    --vocab-file "$out/vocab/vocab.json" --merge-file "$out/vocab/merges.txt" --append-eod --workers 1
mds-index merge --datasets "$out/corpus_text_document" --output-prefix "$out/merged"
train=(--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 32 --max-position-embeddings 32
    --micro-batch-size 2 --global-batch-size 4 --lr 1e-2 --min-lr 1e-3 --lr-decay-style cosine
    --lr-warmup-iters 2 --hidden-dropout 0 --attention-dropout 0 --seed 1234
    --data-path "$out/corpus_text_document" --split 100,0,0 --eval-iters 0
    --vocab-file "$out/vocab/vocab.json" --merge-file "$out/vocab/merges.txt"
    --data-cache-path "$out/cache" --log-interval 1 --zero-stage 1 --train-iters 6)
mds-train "${train[@]}" --exit-interval 4 --save "$out/checkpoint" --save-interval 4 --output-dir "$out/run"
cp -r "$out/checkpoint" "$out/resumed"
deepspeed --num_gpus 2 --master_port 29561 --module mds_train "${train[@]}" --num-layers 2 \
    --pipeline-model-parallel-size 2 --zero-stage 0 --exit-interval 4 --save "$out/pipeline" \
    --save-interval 4 --output-dir "$out/run-pipeline"
mds-train "${train[@]}" --load "$out/resumed" --output-dir "$out/run-resumed"
mds-merge-mp --load "$out/checkpoint" --save "$out/megatron" --target-tensor-model-parallel-size 1 \
    --target-pipeline-model-parallel-size 1 --target-layout megatron
mds-merge-mp export-hf --load "$out/checkpoint" --save "$out/hf"
python - "$out" <<'PY'
import json, sys
from pathlib import Path
import torch
from mds_checkpoint import load_consolidated
from mds_model import GPT
out = Path(sys.argv[1])
losses = {}
for line in (out / "run-resumed/metrics.jsonl").read_text().splitlines():
    record = json.loads(line)
    if "lm_loss" in record:
        losses[record["iteration"]] = record["lm_loss"]
consolidated = load_consolidated(out / "checkpoint")
model = GPT(consolidated.config)
model.load_state_dict(consolidated.state_dict)
model.eval()
tokens = torch.arange(64).reshape(2, 32) % 300
with torch.no_grad():
    logits = model.logits(tokens)
json.dump({"resumed_losses": losses, "logits_sum_abs": float(logits.abs().sum()),
           "logits_first_row": logits[0, 0, :8].tolist()}, open(out / "expected.json", "w"), indent=1)
PY
rm -rf "$out/resumed" "$out/run" "$out/run-resumed" "$out/run-pipeline" "$out/cache" "$out"/*/zero_to_*.py
