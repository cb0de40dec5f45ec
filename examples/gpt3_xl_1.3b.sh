#!/usr/bin/env bash
# GPT-3 XL (1.3B: 24 layers, hidden 2048, 16 heads, seq 2048) on one node of 8 GPUs, data parallel
# only, bf16 with mds-train's fp32 master weights (ZeRO-0). Hyperparameters are upstream's
# examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_dense.sh (the GPT-3 paper's XL row): batch 512 ramped
# up from 32, lr 2e-4 decayed (cosine) to 2e-5 over 260B tokens after 375M of warm-up, 300B tokens.
# Upstream runs fp16 with TP 4 and --checkpoint-activations on 64 GPUs; on 80-141 GiB GPUs one
# replica fits a GPU without recompute. Activation recompute (README "Activation recompute"):
#   none (as here)                      51.5 GiB per GPU at micro-batch 8, 38 GiB at 4 (mds-model info)
#   --recompute-granularity selective   the same with SDPA attention (attention's core recomputed)
#   --recompute-granularity full        27.5 GiB at micro-batch 8; every layer's forward runs twice
# Data: mds-tokenize --input pile.jsonl --output-prefix data/pile --vocab-file gpt2-vocab.json \
#           --merge-file gpt2-merges.txt --append-eod --workers 16
set -euo pipefail
cd "$(dirname "$0")"
mds-model info --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
    --micro-batch-size 4 --data-parallel-size 8 --zero-stage 0 --params-dtype bfloat16
GPUS=${GPUS:-8}
CHECKPOINTS=${CHECKPOINTS:-checkpoints/gpt3_xl_1.3b}
deepspeed --num_gpus "$GPUS" --module mds_train \
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 \
    --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
    --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 512 \
    --rampup-batch-size 32 32 1953125 --train-samples 439453125 --train-tokens 300000000000 \
    --lr 2.0e-4 --min-lr 2.0e-5 --lr-decay-style cosine --lr-warmup-tokens 375000000 \
    --lr-decay-tokens 260000000000 --adam-beta1 0.9 --adam-beta2 0.95 --weight-decay 0.1 \
    --clip-grad 1.0 --init-method-std 0.014 --bf16 --zero-stage 0 \
    --data-path data/pile_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt \
    --split 98,2,0 --log-interval 10 --eval-interval 100 --eval-iters 10 \
    --save "$CHECKPOINTS" --load "$CHECKPOINTS" --save-interval 1000
