"""deepspeedai/Megatron-DeepSpeed's five Llama scripts (examples_deepspeed/, 6acc370a;
finetune_llama.sh as of c3df1877), quoted as written: each one's variable block, DeepSpeed JSON
heredoc and command, with their shell variables (test_upstream_llama_scripts.py runs them). Lines
of control flow whose branch is not taken at the scripts' values are left out, with a comment.
Last, IMPORT_HF: mds's command for finetune_llama.sh's convert_hf2mds step, with its variables."""

# pretrain_llama_distributed.sh; pretrain_llama2_distributed.sh is the same but for NUM_KV_HEADS
# (and `--num-key-value-heads $NUM_KV_HEADS $WANDB_ARGS` before $ds_args, LOG_TO_WANDB=0).
PRETRAIN_LLAMA_VARIABLES = """
BASE_PATH=./tmp
DS_CONFIG=${BASE_PATH}/deepspeed.json
DATASET_1="./tmp/data/bookcorpus_train_1m_text_sentence"
DATASET="1 ${DATASET_1}"
CHECKPOINT_PATH=./tmp
TOKENIZER_PATH=./tmp/tokenizer.model # offical llama tokenizer.model

TP=2
PP=2
ZERO_STAGE=0

GPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=1
NODE_RANK=0

HIDDEN_SIZE=2048 # e.g. llama-13b: 5120
FFN_HIDDEN_SIZE=5504 # e.g. llama-13b: 13824
NUM_LAYERS=24 # e.g. llama-13b: 40
NUM_HEADS=16 # e.g. llama-13b: 40
SEQ_LENGTH=2048
NUM_KV_HEADS=4 # llama2 70B uses GQA

MICRO_BATCH_SIZE=4
GLOBAL_BATCH_SIZE=32 # e.g. llama: 4M tokens
TRAIN_STEPS=250000 # e.g. llama: 1T tokens / 4M tokens_per_batch = 250000 steps
LR=3e-4
MIN_LR=3e-5
LR_WARMUP_STEPS=2000
WEIGHT_DECAY=0.1
GRAD_CLIP=1
WANDB_ARGS=
"""
PRETRAIN_LLAMA_CONFIG = """
{
  "train_batch_size" : $GLOBAL_BATCH_SIZE,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": $ZERO_STAGE
  },
  "bf16": {
    "enabled": true
  }
}
"""
# activation_checkpoint="false": the `if` that adds recompute flags is not taken.
DS_ARGS = """
ds_args=""
ds_args=" --deepspeed ${ds_args}"
ds_args=" --deepspeed_config=$DS_CONFIG ${ds_args}"
ds_args=" --zero-stage=$ZERO_STAGE ${ds_args}"
"""
PRETRAIN_LLAMA = """
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port $MASTER_PORT"

torchrun $DISTRIBUTED_ARGS \\
       pretrain_gpt.py \\
       --tensor-model-parallel-size $TP \\
       --pipeline-model-parallel-size $PP \\
       --num-layers $NUM_LAYERS \\
       --hidden-size $HIDDEN_SIZE \\
       --ffn-hidden-size $FFN_HIDDEN_SIZE \\
       --num-attention-heads $NUM_HEADS \\
       --micro-batch-size $MICRO_BATCH_SIZE \\
       --global-batch-size $GLOBAL_BATCH_SIZE \\
       --seq-length $SEQ_LENGTH \\
       --max-position-embeddings $SEQ_LENGTH \\
       --train-iters $TRAIN_STEPS \\
       --save $CHECKPOINT_PATH \\
       --load $CHECKPOINT_PATH \\
       --data-path $DATASET \\
       --data-impl mmap \\
       --tokenizer-type GPTSentencePieceTokenizer \\
       --tokenizer-model $TOKENIZER_PATH \\
       --split 949,50,1 \\
       --distributed-backend nccl \\
       --lr $LR \\
       --lr-decay-style cosine \\
       --min-lr $MIN_LR \\
       --weight-decay $WEIGHT_DECAY \\
       --clip-grad $GRAD_CLIP \\
       --lr-warmup-iters $LR_WARMUP_STEPS \\
       --optimizer adam \\
       --adam-beta1 0.9 \\
       --adam-beta2 0.95 \\
       --log-interval 1 \\
       --save-interval 10000 \\
       --eval-interval 1000 \\
       --eval-iters 10 \\
       --bf16 \\
       --no-query-key-layer-scaling \\
       --attention-dropout 0 \\
       --hidden-dropout 0 \\
       --use-rotary-position-embeddings \\
       --untie-embeddings-and-output-weights \\
       --swiglu \\
       --normalization rmsnorm \\
       --disable-bias-linear \\
       $ds_args
"""  # noqa: E501 - DISTRIBUTED_ARGS as the scripts write it
PRETRAIN_LLAMA2_TAIL = """\
       --disable-bias-linear \\
       --num-key-value-heads $NUM_KV_HEADS \\
       $WANDB_ARGS \\
       $ds_args
"""

# universal_checkpointing/llama/run_llama_bf16.sh; run_universal_llama_bf16.sh differs in DP=1,
# LOAD_*=2,2,2,1, RUN_TAG and `--universal-checkpoint` before $ds_args.
UNIVERSAL_VARIABLES = """
BASE_PATH=dataset
DS_CONFIG=${BASE_PATH}/deepspeed.json
DATASET=${BASE_PATH}/my-gpt2_text_document
TOKENIZER_PATH=${BASE_PATH}/llama-7b/tokenizer.model # offical llama tokenizer.model

GPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=1
NODE_RANK=0

HIDDEN_SIZE=2048 # e.g. llama-13b: 5120
FFN_HIDDEN_SIZE=5504 # e.g. llama-13b: 13824
NUM_LAYERS=24 # e.g. llama-13b: 40
NUM_HEADS=16 # e.g. llama-13b: 40
SEQ=2048

LR_WARMUP_STEPS=2000
WEIGHT_DECAY=0.1
GRAD_CLIP=1

ZERO_STAGE=1
DTYPE="bf16"

TP=2
PP=2
DP=2
SP=1
WORLD_SIZE=$((TP*PP*DP*SP))
GLOBAL_BATCH=32
MICRO_BATCH=$((GLOBAL_BATCH/WORLD_SIZE))
TRAIN_ITERS=250000
LR=3e-4
MIN_LR=3e-5

LOAD_TP=$TP
LOAD_PP=$PP
LOAD_DP=$DP
LOAD_SP=$SP
RUN_TAG="save"

EXP_DIR="z${ZERO_STAGE}_uni_ckpt"
CHECKPOINT_PATH=${EXP_DIR}/checkpoints/llama/z${ZERO_STAGE}/$DTYPE/tp${TP}_pp${PP}_dp${DP}_sp${SP}_${SIZE_TAG}
LOAD_CHECKPOINT_PATH=${EXP_DIR}/checkpoints/llama/z${ZERO_STAGE}/$DTYPE/tp${LOAD_TP}_pp${LOAD_PP}_dp${LOAD_DP}_sp${LOAD_SP}_${SIZE_TAG}
LOG_DIR="${EXP_DIR}/tensorboard/llama/$DTYPE/tp${TP}_pp${PP}_dp${DP}_sp${SP}_hd${HIDDEN}_nl${LAYERS}_gbsz${GLOBAL_BATCH}_mbsz${MICRO_BATCH}_z${ZERO_STAGE}_LR_${LR}_${MIN_LR}_${DTYPE}_${SIZE_TAG}_${RUN_TAG}"
"""
UNIVERSAL_SAVE_LOAD = """
LOAD_TP=$TP
LOAD_PP=$PP
LOAD_DP=$DP
LOAD_SP=$SP
RUN_TAG="save"
"""
UNIVERSAL_RESUME_LOAD = """
LOAD_TP=2
LOAD_PP=2
LOAD_DP=2
LOAD_SP=1
RUN_TAG="uni_load${LOAD_TP}_${LOAD_PP}_${LOAD_DP}_${LOAD_SP}"
"""
UNIVERSAL_CONFIG = """
{
  "train_batch_size" : $GLOBAL_BATCH,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH,
  "steps_per_print": 1,

  "zero_optimization": {
    "stage": $ZERO_STAGE
  },

  "bf16": {
    "enabled": true
  },

  "wall_clock_breakdown" : false
}
"""
# ZERO_STAGE=1: the `if` that adds --no-pipeline-parallel (ZeRO > 1) is not taken.
UNIVERSAL_OPTIONS = """
options="\\
       --tensor-model-parallel-size $TP \\
       --pipeline-model-parallel-size $PP \\
       --ds-sequence-parallel-size $SP \\
       --num-layers $NUM_LAYERS \\
       --hidden-size $HIDDEN_SIZE \\
       --ffn-hidden-size $FFN_HIDDEN_SIZE \\
       --num-attention-heads $NUM_HEADS \\
       --micro-batch-size $MICRO_BATCH \\
       --global-batch-size $GLOBAL_BATCH \\
       --seq-length $SEQ \\
       --max-position-embeddings $SEQ \\
       --train-iters $TRAIN_ITERS \\
       --save ${CHECKPOINT_PATH} \\
       --load ${LOAD_CHECKPOINT_PATH} \\
       --data-path $DATASET \\
       --data-impl mmap \\
       --tokenizer-type GPTSentencePieceTokenizer \\
       --tokenizer-model $TOKENIZER_PATH \\
       --split 949,50,1 \\
       --distributed-backend nccl \\
       --lr $LR \\
       --lr-decay-style cosine \\
       --min-lr $MIN_LR \\
       --weight-decay $WEIGHT_DECAY \\
       --clip-grad $GRAD_CLIP \\
       --lr-warmup-iters $LR_WARMUP_STEPS \\
       --optimizer adam \\
       --adam-beta1 0.9 \\
       --adam-beta2 0.95 \\
       --log-interval 1 \\
       --save-interval 100 \\
       --eval-interval 10 \\
       --eval-iters 40 \\
\t   --exit-interval ${EXIT_INTERVAL} \\
       --${DTYPE} \\
       --no-query-key-layer-scaling \\
       --attention-dropout 0 \\
       --hidden-dropout 0 \\
       --use-rotary-position-embeddings \\
       --untie-embeddings-and-output-weights \\
       --swiglu \\
       --normalization rmsnorm \\
       --disable-bias-linear \\
       --tensorboard-dir $LOG_DIR \\
       $ds_args
"

WORKER_STR="--num_nodes 1 --num_gpus $WORLD_SIZE"
run_cmd="deepspeed --master_port 29700 $WORKER_STR ${DIR}/pretrain_gpt.py $@ ${options}"
"""

# finetune_hf_llama/finetune_llama.sh (c3df1877); run without an argument, task_args is
# finetune_args and DS_CONFIG_PATH its ds_config.json, the file the heredoc writes.
FINETUNE_VARIABLES = """
DS_CONFIG=./examples_deepspeed/finetune_hf_llama/ds_config.json
DATASET_PATH=./examples_deepspeed/finetune_hf_llama/alpaca_data.json

HF_LLAMA_PATH=/data/llama-2-7b-hf/

MICRO_BATCH_SIZE=16
GLOBAL_BATCH_SIZE=256
TP=2
PP=2
HIDDEN_SIZE=4096
FFN_HIDDEN_SIZE=11008
NUM_LAYERS=32
NUM_HEADS=32
SEQ_LENGTH=512

MEGA_DS_LLAMA_PATH=./"llama-7b-mega-ds-T${TP}P${PP}"
DS_CONFIG_PATH="./examples_deepspeed/finetune_hf_llama/ds_config.json"
"""
FINETUNE_CONFIG = """
{
  "train_batch_size" : $GLOBAL_BATCH_SIZE,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "steps_per_print": 100,
  "zero_optimization": {
    "stage": 0
  },
  "bf16": {
    "enabled": true
  }
}
"""
FINETUNE = """
finetune_args="deepspeed finetune_llama.py \\
--load $MEGA_DS_LLAMA_PATH"

comm_args="--tensor-model-parallel-size $TP \\
--pipeline-model-parallel-size $PP \\
--lr-warmup-iters 2000 \\
--weight-decay 0.1 \\
--clip-grad 1 \\
--num-layers $NUM_LAYERS \\
--hidden-size $HIDDEN_SIZE \\
--num-attention-heads $NUM_HEADS \\
--finetune \\
--ffn-hidden-size $FFN_HIDDEN_SIZE \\
--attention-dropout 0 \\
--hidden-dropout 0 \\
--no-query-key-layer-scaling \\
--disable-bias-linear \\
--normalization rmsnorm \\
--use-rotary-position-embeddings \\
--untie-embeddings-and-output-weights \\
--swiglu \\
--seq-length $SEQ_LENGTH \\
--max-position-embeddings $SEQ_LENGTH \\
--micro-batch-size $MICRO_BATCH_SIZE \\
--global-batch-size $GLOBAL_BATCH_SIZE \\
--train-iters 3500 \\
--lr 2e-5 \\
--tensorboard-dir tensorboard_output \\
--lr-decay-iters 320000 \\
--lr-decay-style cosine \\
--log-interval 1 \\
--eval-iters 100 \\
--eval-interval 100 \\
--data-path $DATASET_PATH \\
--save-interval 1500 \\
--split 100,0,0 \\
--bf16 \\
--zero-stage 0 \\
--tokenizer-type HFTokenizer \\
--tokenizer-model $HF_LLAMA_PATH \\
--deepspeed_config $DS_CONFIG_PATH \\
--deepspeed \\
--distributed-backend nccl \\
--num-workers 0 \\
--no-masked-softmax-fusion \\
--no-bias-gelu-fusion \\
--no-bias-dropout-fusion \\
--no-gradient-accumulation-fusion \\
--repeated-dataloader"

task_args="$finetune_args"
full_cmd="$task_args $comm_args"
"""
# The convert_hf2mds step, in mds: the script's variables, mds-merge-mp's flags, and the
# tokenizer flags upstream's converter reads from comm_args (recorded in meta.json).
IMPORT_HF = """
mds-merge-mp import-hf --load $HF_LLAMA_PATH --save $MEGA_DS_LLAMA_PATH \\
--target-tensor-model-parallel-size $TP --target-pipeline-model-parallel-size $PP \\
--seq-length $SEQ_LENGTH --tokenizer-type HFTokenizer --tokenizer-model $HF_LLAMA_PATH
"""
