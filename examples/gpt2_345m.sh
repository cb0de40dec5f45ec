#!/usr/bin/env bash
# GPT-2 345M, Megatron-DeepSpeed's walk-through with pretrain_gpt.py replaced by mds-train: fp16,
# ZeRO-3 with the optimizer offloaded to the CPU (ds_zero3_offload.json, the walk-through's file,
# including its deprecated "cpu_offload": true, which mds-train reads with a warning).
# Data: mds-tokenize --input owt.jsonl --output-prefix data/my-gpt2 --vocab-file gpt2-vocab.json \
#           --merge-file gpt2-merges.txt --append-eod --workers 16
set -euo pipefail
cd "$(dirname "$0")"
GPUS=${GPUS:-8}
CHECKPOINTS=${CHECKPOINTS:-checkpoints/gpt2_345m}
deepspeed --num_gpus "$GPUS" --module mds_train \
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 \
    --num-layers 24 --hidden-size 1024 --num-attention-heads 16 \
    --micro-batch-size 8 --global-batch-size 64 --seq-length 1024 --max-position-embeddings 1024 \
    --train-iters 500000 --lr-decay-iters 320000 \
    --save "$CHECKPOINTS" --load "$CHECKPOINTS" \
    --data-path data/my-gpt2_text_document --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt \
    --data-impl mmap --split 949,50,1 --distributed-backend nccl \
    --lr 0.00015 --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 1e-2 --clip-grad 1.0 \
    --lr-warmup-fraction .01 --checkpoint-activations \
    --log-interval 100 --save-interval 10000 --eval-interval 1000 --eval-iters 10 --fp16 \
    --deepspeed --deepspeed_config ds_zero3_offload.json --zero-stage 3 \
    --partition-activations --deepspeed-activation-checkpointing
