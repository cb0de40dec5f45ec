#!/usr/bin/env bash
# The GPT-3 175B layout (96 layers, hidden 12288, 96 heads, seq 2048) with TP 8 and PP 8: 64 GPUs
# per model replica, bf16, ZeRO-1 in the pipeline engine. First the plan (parameters, FLOPs and
# memory per GPU), then the run across the nodes of a hostfile.
set -euo pipefail
cd "$(dirname "$0")"
mds-model info --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 \
    --micro-batch-size 1 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 \
    --data-parallel-size 2 --zero-stage 1 --activation-checkpointing full --sequence-parallel \
    --params-dtype bfloat16
CHECKPOINTS=${CHECKPOINTS:-checkpoints/gpt3_175b}
deepspeed --hostfile "${HOSTFILE:-hostfile}" --module mds_train \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --sequence-parallel \
    --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 \
    --max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 1536 \
    --rampup-batch-size 16 16 5859375 --train-samples 146484375 --lr-decay-samples 126953125 \
    --lr-warmup-samples 183105 --lr 6.0e-5 --min-lr 6.0e-6 --lr-decay-style cosine \
    --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --weight-decay 0.1 --init-method-std 0.006 \
    --bf16 --zero-stage 1 --checkpoint-activations \
    --data-path data/pile_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt \
    --split 969,30,1 --log-interval 1 --eval-interval 1000 --eval-iters 10 \
    --save "$CHECKPOINTS" --load "$CHECKPOINTS" --save-interval 1000 \
    --exit-duration-in-mins 1430 --kill-switch-path "$CHECKPOINTS/STOP"
