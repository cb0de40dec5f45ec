#!/usr/bin/env bash
# bigscience's tiny test_training run (BLOOM's options: embedding LayerNorm, ALiBi, batch ramp-up,
# fp16, ZeRO-1, TensorBoard), with pretrain_gpt.py replaced by mds-train.
set -euo pipefail
cd "$(dirname "$0")"
GPUS=${GPUS:-2}
OUT=${OUT:-checkpoints/bigscience_tiny}
deepspeed --num_gpus "$GPUS" --module mds_train \
    --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 256 \
    --max-position-embeddings 1024 --micro-batch-size 1 --rampup-batch-size 2 2 80 \
    --global-batch-size 16 --train-samples 160 --embed-layernorm --position-embedding-type alibi \
    --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --lr 1e-4 \
    --lr-warmup-samples 5 --clip-grad 1.0 --weight-decay 1e-1 --fp16 --log-interval 5 \
    --save-interval 10 --eval-interval 10 --eval-iters 5 --checkpoint-activations \
    --exit-interval 20 --merge-file gpt2-merges.txt --vocab-file gpt2-vocab.json \
    --save "$OUT" --load "$OUT" --data-path data/meg-gpt2_text_document \
    --tensorboard-dir "$OUT/tensorboard" --tensorboard-queue-size 5 \
    --log-timers-to-tensorboard --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard \
    --zero-stage 1 --deepspeed-activation-checkpointing \
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --distributed-backend nccl
