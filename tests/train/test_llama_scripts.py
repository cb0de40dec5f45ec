"""Upstream's five Llama scripts (deepspeedai/Megatron-DeepSpeed 6acc370a, examples_deepspeed/)
as mds-train reads them: each script's trainer flags as it passes them, its shell variables at its
own values but the model and batch scaled down, and the DeepSpeed JSON it writes. The tokenizer
flags are upstream's (`--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model
$TOKENIZER_PATH`, finetune_llama.sh's `--tokenizer-type HFTokenizer --tokenizer-model
$HF_LLAMA_PATH`), the files made here: a SentencePiece model learned from c4_demo.jsonl, and a
Hugging Face folder of the same pieces. Everything else parses (finetune_llama.sh's
`--repeated-dataloader` is noted: the sample index already holds the epochs --train-iters needs),
validates at the script's world size and builds the Llama preset, and mds-train reads the
tokenizer as upstream builds it; test_llama.py trains it."""

import json
from pathlib import Path

import pytest
import sentencepiece
from mds_model.config import ARCHITECTURES
from mds_train.cli import build_config
from mds_train.data import read_vocabulary
from mds_train.ds_file import resolve_user_config
from mds_train.megatron_flags import classify, megatron_flags_given
from tokenizers import Tokenizer, models

from .test_config import parse_given

# Scaled down: upstream's h 2048, ffn 5504, 24 layers, 16 heads (4 key/value heads), seq 2048.
SIZES = {
    "HIDDEN_SIZE": "64",
    "FFN_HIDDEN_SIZE": "176",
    "NUM_LAYERS": "4",
    "NUM_HEADS": "8",
    "NUM_KV_HEADS": "4",
    "SEQ": "128",
}
# Upstream's flag block, as each script writes it.
LLAMA_BLOCK = """--no-query-key-layer-scaling --attention-dropout 0 --hidden-dropout 0
    --use-rotary-position-embeddings --untie-embeddings-and-output-weights --swiglu
    --normalization rmsnorm --disable-bias-linear"""
PRETRAIN_LLAMA = f"""--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
    --num-layers $NUM_LAYERS --hidden-size $HIDDEN_SIZE --ffn-hidden-size $FFN_HIDDEN_SIZE
    --num-attention-heads $NUM_HEADS --micro-batch-size 4 --global-batch-size 32
    --seq-length $SEQ --max-position-embeddings $SEQ --train-iters 250000 --save ./tmp
    --load ./tmp --data-path 1 ./tmp/data/bookcorpus_train_1m_text_sentence --data-impl mmap
    $SENTENCEPIECE --split 949,50,1 --distributed-backend nccl --lr 3e-4 --lr-decay-style cosine
    --min-lr 3e-5 --weight-decay 0.1 --clip-grad 1 --lr-warmup-iters 2000 --optimizer adam
    --adam-beta1 0.9 --adam-beta2 0.95 --log-interval 1 --save-interval 10000
    --eval-interval 1000 --eval-iters 10 --bf16 {LLAMA_BLOCK}"""
DS_ARGS = "--zero-stage=$ZERO_STAGE --deepspeed_config=$DS_CONFIG --deepspeed"
UNIVERSAL_LLAMA = f"""--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
    --ds-sequence-parallel-size 1 --num-layers $NUM_LAYERS --hidden-size $HIDDEN_SIZE
    --ffn-hidden-size $FFN_HIDDEN_SIZE --num-attention-heads $NUM_HEADS
    --micro-batch-size $MICRO_BATCH --global-batch-size 32 --seq-length $SEQ
    --max-position-embeddings $SEQ --train-iters 250000 --save checkpoint --load checkpoint
    --data-path dataset/my-gpt2_text_document --data-impl mmap $SENTENCEPIECE --split 949,50,1
    --distributed-backend nccl --lr 3e-4 --lr-decay-style cosine --min-lr 3e-5
    --weight-decay 0.1 --clip-grad 1 --lr-warmup-iters 2000 --optimizer adam --adam-beta1 0.9
    --adam-beta2 0.95 --log-interval 1 --save-interval 100 --eval-interval 10 --eval-iters 40
    --exit-interval 200 --bf16 {LLAMA_BLOCK} --tensorboard-dir tensorboard"""
FINETUNE_LLAMA = f"""--load mega_ds_llama --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 2 --lr-warmup-iters 2000 --weight-decay 0.1 --clip-grad 1
    --num-layers $NUM_LAYERS --hidden-size $HIDDEN_SIZE --num-attention-heads $NUM_HEADS
    --ffn-hidden-size $FFN_HIDDEN_SIZE {LLAMA_BLOCK} --seq-length $SEQ
    --max-position-embeddings $SEQ --micro-batch-size 16 --global-batch-size 256
    --train-iters 3500 --lr 2e-5 --tensorboard-dir tensorboard_output --lr-decay-iters 320000
    --lr-decay-style cosine --log-interval 1 --eval-iters 100 --eval-interval 100
    --data-path alpaca_text_document --save-interval 1500 --split 100,0,0 --bf16 --zero-stage 0
    --tokenizer-type HFTokenizer --tokenizer-model $HF_LLAMA_PATH --deepspeed_config $DS_CONFIG
    --deepspeed --distributed-backend nccl
    --num-workers 0 --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion
    --no-gradient-accumulation-fusion --repeated-dataloader"""

# run_llama_bf16.sh, pretrain_llama*_distributed.sh write it so
SENTENCEPIECE = "--tokenizer-type GPTSentencePieceTokenizer --tokenizer-model $TOKENIZER_PATH"

# script: (its trainer flags, world size, ZeRO stage, its DeepSpeed JSON's batch sizes)
SCRIPTS = {
    "pretrain_llama_distributed.sh": (f"{PRETRAIN_LLAMA} {DS_ARGS}", 8, 0, (32, 4)),
    "pretrain_llama2_distributed.sh": (
        f"{PRETRAIN_LLAMA} --num-key-value-heads $NUM_KV_HEADS {DS_ARGS}",
        8,
        0,
        (32, 4),
    ),
    # upstream's JSON: ds_config.json, train_batch_size 256, micro 16
    "finetune_hf_llama/finetune_llama.sh": (f"{FINETUNE_LLAMA} --finetune", 4, 0, (256, 16)),
    # TP 2 x PP 2 x DP 2, micro = 32 / 8; the universal run loads it at DP 1
    "universal_checkpointing/llama/run_llama_bf16.sh": (
        f"{UNIVERSAL_LLAMA} {DS_ARGS}",
        8,
        1,
        (32, 4),
    ),
    "universal_checkpointing/llama/run_universal_llama_bf16.sh": (
        f"{UNIVERSAL_LLAMA} --universal-checkpoint {DS_ARGS}",
        4,
        1,
        (32, 8),
    ),
}
PIECES = 500  # a tiny Llama-2-like SentencePiece model (BPE, byte fallback)


@pytest.fixture(scope="module")
def tokenizer_files(shared_data, tmp_path_factory) -> dict[str, str]:
    """$TOKENIZER_PATH (a tokenizer.model) and $HF_LLAMA_PATH (a folder with its pieces as a
    Hugging Face tokenizer.json and the eos token in tokenizer_config.json)."""
    folder = tmp_path_factory.mktemp("tokenizers")
    lines = (shared_data / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()[:50]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=(json.loads(line)["text"] for line in lines),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=PIECES,
        model_type="bpe",
        byte_fallback=True,
        num_threads=1,
        minloglevel=2,
    )
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    pieces = {processor.id_to_piece(i): i for i in range(len(processor))}
    hf = folder / "llama-hf"
    hf.mkdir()
    tokenizer = Tokenizer(models.WordLevel(vocab=pieces, unk_token="<unk>"))
    tokenizer.save(str(hf / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (hf / "tokenizer_config.json").write_text(json.dumps(config))
    return {"TOKENIZER_PATH": str(folder / "tokenizer.model"), "HF_LLAMA_PATH": str(hf)}


def script_argv(name: str, tmp_path: Path, files: dict[str, str]) -> list[str]:
    flags, world, zero, (batch, micro) = SCRIPTS[name]
    config = tmp_path / "deepspeed.json"
    config.write_text(
        json.dumps(
            {
                "train_batch_size": batch,
                "train_micro_batch_size_per_gpu": micro,
                "steps_per_print": 1,
                "zero_optimization": {"stage": zero},
                "bf16": {"enabled": True},
            }
        )
    )
    values = {
        **SIZES,
        "ZERO_STAGE": str(zero),
        "MICRO_BATCH": str(micro),
        "DS_CONFIG": str(config),
        "SENTENCEPIECE": SENTENCEPIECE,
        **files,
    }
    for variable, value in values.items():
        flags = flags.replace(f"${variable}", value)
    return flags.split()


@pytest.mark.parametrize("name", SCRIPTS)
def test_upstream_s_llama_script_validates_and_builds_the_llama_preset(
    name, tmp_path, tokenizer_files
):
    argv = script_argv(name, tmp_path, tokenizer_files)
    values, given = parse_given(argv)
    megatron_flags_given(values)  # a refused flag (or value) would end the command line here
    config = build_config(values)
    _, world, zero, _ = SCRIPTS[name]
    topology = config.topology(world)
    config.validate(topology)
    user = json.loads(Path(config.parallel.deepspeed_config).read_text())
    config = resolve_user_config(config, user, topology, given=given, source="deepspeed.json")
    assert (topology.tensor_model_parallel_size, topology.pipeline_model_parallel_size) == (2, 2)
    assert config.parallel.zero_stage == zero and config.params_dtype == "bfloat16"
    model = config.model.gpt_config(
        vocab_size=32000, tensor_model_parallel_size=2, params_dtype="bfloat16"
    )
    assert {f: getattr(model, f) for f in ARCHITECTURES["llama"]} == ARCHITECTURES["llama"]
    assert model.ffn_size == 176 and (model.hidden_dropout, model.attention_dropout) == (0, 0)
    assert model.query_groups == (4 if "llama2" in name else 8)
    # the tokenizer the flags name, as mds-train reads it: upstream's eod and vocabulary size
    vocabulary = read_vocabulary(config.data)
    record = vocabulary.record
    if "finetune" in name:  # HFTokenizer: the eos token; [PAD] added (its config has none)
        assert (record.kind, vocabulary.eod_id, record.vocab_size) == ("HFTokenizer", 2, PIECES + 1)
    else:  # GPTSentencePieceTokenizer: the model's eos id and pieces
        assert (record.kind, vocabulary.eod_id, record.vocab_size) == (
            "GPTSentencePieceTokenizer",
            2,
            PIECES,
        )
    assert record.tokenizer_file.startswith(str(Path(tokenizer_files["TOKENIZER_PATH"]).parent))


def test_the_tokenizer_flags_upstream_s_scripts_pass_work():
    """mds-train's own flags now (no longer refused); --repeated-dataloader stays noted."""
    assert classify("--tokenizer-model").status == "works"
    assert classify("--repeated-dataloader").status == "ignored"
