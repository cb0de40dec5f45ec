"""The seeds' command lines (../shared/docs/seeds/), run with only the script name changed.

Each document's lines are quoted below as written, with their shell variables; the test sets the
variables, scales sizes (layers, hidden, sequence, batch, iterations, GPUs) to a CPU, points the
paths at the shared data, and swaps the script: pretrain_gpt.py -> mds-train,
tools/merge_mp_partitions.py -> mds-merge-mp, tools/generate_samples_gpt.py -> mds-generate.
Launchers get a free port instead of the documents' fixed ones. Without a GPU, the documents'
`--distributed-backend nccl` runs on gloo and `--fp16` in fp32 (packages/train/README.md, "Launch"),
each with one note.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from string import Template

import pytest
import torch

GOLDEN = "megatron-golden/meg-gpt2-openwebtext_text_document"
NO_GPU = not torch.cuda.is_available()

# 000_89e3e707dee2c347.txt, "Create Pre-training scripts" (pretrain_gpt2.sh, the 345M model).
WALKTHROUGH = """
python -m torch.distributed.launch $DISTRIBUTED_ARGS \\
       pretrain_gpt.py \\
       --tensor-model-parallel-size 1 \\
       --pipeline-model-parallel-size 1 \\
       --num-layers 24 \\
       --hidden-size 1024 \\
       --num-attention-heads 16 \\
       --micro-batch-size 4 \\
       --global-batch-size 8 \\
       --seq-length 1024 \\
       --max-position-embeddings 1024 \\
       --train-iters 5000 \\
       --lr-decay-iters 320000 \\
       --save $CHECKPOINT_PATH \\
       --load $CHECKPOINT_PATH \\
       --data-path $DATA_PATH \\
       --vocab-file data/gpt2-vocab.json \\
       --merge-file data/gpt2-merges.txt \\
       --data-impl mmap \\
       --split 949,50,1 \\
       --distributed-backend nccl \\
       --lr 0.00015 \\
       --lr-decay-style cosine \\
       --min-lr 1.0e-5 \\
       --weight-decay 1e-2 \\
       --clip-grad 1.0 \\
       --lr-warmup-fraction .01 \\
       --checkpoint-activations \\
       --log-interval 10 \\
       --save-interval 500 \\
       --eval-interval 100 \\
       --eval-iters 10 \\
       --fp16
"""
WALKTHROUGH_DISTRIBUTED = (
    "--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK "
    "--master_addr $MASTER_ADDR --master_port $MASTER_PORT"
)

# 000, "Use deepspeed ZeRO": pretrain_gpt2.sh and its deepspeed_config.json.
ZERO3_ARGS = """
GPT_ARGS=" \\
    --num-layers 24 \\
    --hidden-size 1024 \\
    --num-attention-heads 16 \\
    --seq-length 1024 \\
    --max-position-embeddings 1024 \\
    --tensor-model-parallel-size 4 \\
    --pipeline-model-parallel-size 1 \\
    --micro-batch-size 1 \\
    --global-batch-size 4 \\
    --lr-decay-iters 320000 \\
    --lr 0.00015 \\
    --min-lr 1.0e-5 \\
    --lr-decay-style cosine \\
    --train-iters 5000 \\
    --vocab-file $VOCAB_FILE \\
    --merge-file $MERGE_FILE \\
    --data-impl mmap \\
    --split 949,50,1 \\
    --distributed-backend nccl \\
    --weight-decay 1e-2 \\
    --clip-grad 1.0 \\
    --lr-warmup-fraction .01 \\
    --fp16 \\
    "

OUTPUT_ARGS=" \\
    --log-interval 10 \\
    --save-interval 500 \\
    --eval-interval 100 \\
    --eval-iters 10 \\
    --checkpoint-activations \\
    "

DATA_ARGS=" \\
    --save $CHECKPOINT_PATH \\
    --load $CHECKPOINT_PATH \\
    --data-path $DATA_PATH \\
    "

ALL_ARGS="$GPT_ARGS $OUTPUT_ARGS $DATA_ARGS  --deepspeed_config $CONFIG_JSON"
"""
ZERO3_CONFIG = """
{
"fp16": {
"enabled": true
    },
"zero_optimization": {
"stage": 3,
"allgather_partitions": true,
"allgather_bucket_size": 2e8,
"overlap_comm": true,
"reduce_scatter": true,
"reduce_bucket_size": 2e8,
"contiguous_gradients": true,
"cpu_offload": true
    }
}
"""

# 003_64ee9388fb03cd1c.txt, "step6: Train" (bigscience's tiny GPT with ramp-up).
BIGSCIENCE_003 = """
GPT_ARGS=" \\
    --num-layers $NLAYERS \\
    --hidden-size $NHIDDEN \\
    --num-attention-heads $NHEADS \\
    --seq-length $SEQ_LEN \\
    --max-position-embeddings $SEQ_LEN \\
    --micro-batch-size $MICRO_BATCH_SIZE \\
    --rampup-batch-size 2 2 1_000 \\
    --global-batch-size $GLOBAL_BATCH_SIZE \\
    --train-samples $TRAIN_SAMPLES \\
    --optimizer adam \\
    --adam-beta1 0.9 \\
    --adam-beta2 0.95 \\
    --adam-eps 1e-8 \\
    --lr 1e-4 \\
    --lr-warmup-samples 5 \\
    --min-lr 1e-6 \\
    --lr-decay-style cosine \\
    --lr-decay-samples 12 \\
    --clip-grad 1.0 \\
    --weight-decay 1e-1 \\
    --embed-layernorm \\
    --fp16 \\
    --partition-activations \\
    --seed 42 \\
    --vocab-file $VOCAB_FILE \\
    --merge-file $MERGE_FILE \\
    "

OUTPUT_ARGS=" \\
    --exit-interval 100 \\
    --log-interval 10 \\
    --save-interval $SAVE_INTERVAL \\
    --eval-interval 100 \\
    --eval-iters 10 \\
    --checkpoint-activations \\
    "

DATA_ARGS=" \\
    --save $CHECKPOINT_PATH \\
    --load $CHECKPOINT_PATH \\
    --data-path $DATA_PATH \\
    --tensorboard-dir $TENSORBOARD_PATH \\
    --tensorboard-queue-size 5 \\
    --log-timers-to-tensorboard \\
    --log-batch-size-to-tensorboard \\
    --log-validation-ppl-to-tensorboard \\
    --kill-switch-path /tmp/kill-switch \\
    "

DEEPSPEED_ARGS=" \\
    --deepspeed \\
    --deepspeed_config ${config_json} \\
    --zero-stage ${ZERO_STAGE} \\
    --deepspeed-activation-checkpointing \\
    "

ALL_ARGS="$GPT_ARGS $OUTPUT_ARGS $DATA_ARGS $DEEPSPEED_ARGS"

export LAUNCHER="python -u -m torch.distributed.run \\
    --nproc_per_node $N_GPUS \\
    --nnodes 1 \\
    --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT \\
    --rdzv_backend c10d \\
    --max_restarts 0 \\
    --tee 3 \\
    "
export CMD=" \\
    $LAUNCHER pretrain_gpt.py \\
    --tensor-model-parallel-size $TP_SIZE \\
    --pipeline-model-parallel-size $PP_SIZE \\
    --distributed-backend nccl \\
    $ALL_ARGS \\
    "
"""
# 003's and 004's ds_config.json (the heredoc, "Deepspeed figures out GAS dynamically from
# dynamic GBS via set_train_batch_size()").
BIGSCIENCE_CONFIG = """
{
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "train_batch_size": $GLOBAL_BATCH_SIZE,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": $ZERO_STAGE
  },
  "fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 12
  },
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
"""

# 004_8e48eb58116173b7.txt, the DeepSpeed pretraining script (its GPT_ARGS are 003's but for
# --min-lr, --lr-decay-style, --lr-decay-samples, --embed-layernorm, --partition-activations,
# --seed; the launcher is deepspeed).
BIGSCIENCE_004 = """
GPT_ARGS=" \\
--num-layers 2 \\
--hidden-size 64 \\
--num-attention-heads 2 \\
--seq-length 1024 \\
--max-position-embeddings 1024 \\
--micro-batch-size $MICRO_BATCH_SIZE \\
--rampup-batch-size 2 2 1_000 \\
--global-batch-size $GLOBAL_BATCH_SIZE \\
--train-samples 100 \\
--optimizer adam \\
--adam-beta1 0.9 \\
--adam-beta2 0.95 \\
--adam-eps 1e-8 \\
--lr 1e-4 \\
--lr-warmup-samples 5 \\
--clip-grad 1.0 \\
--weight-decay 1e-1 \\
--vocab-file $VOCAB_FILE \\
--merge-file $MERGE_FILE \\
--fp16 \\
"
OUTPUT_ARGS=" \\
--log-interval 10 \\
--save-interval $SAVE_INTERVAL \\
--eval-interval 100 \\
--eval-iters 10 \\
--checkpoint-activations \\
"
DATA_ARGS=" \\
--save $CHECKPOINT_PATH \\
--load $CHECKPOINT_PATH \\
--data-path $DATA_PATH \\
--tensorboard-dir $TENSORBOARD_PATH \\
--tensorboard-queue-size 5 \\
--log-timers-to-tensorboard \\
--log-batch-size-to-tensorboard \\
--log-validation-ppl-to-tensorboard \\
"
DEEPSPEED_ARGS=" \\
--deepspeed \\
--deepspeed_config ${config_json} \\
--zero-stage ${ZERO_STAGE} \\
--deepspeed-activation-checkpointing \\
"
ALL_ARGS="$GPT_ARGS $OUTPUT_ARGS $DATA_ARGS $DEEPSPEED_ARGS"
LAUNCHER="deepspeed --num_gpus $N_GPUS"
export CMD=" \\
$LAUNCHER pretrain_gpt.py \\
--tensor-model-parallel-size $TP_SIZE \\
--pipeline-model-parallel-size $PP_SIZE \\
--distributed-backend nccl \\
$ALL_ARGS \\
"
"""

# 004, merge_mp_partitions.py: a 2-way tensor-parallel checkpoint to 2 pipeline stages. The
# document's example is a BERT (--model-type BERT, --tokenizer-type BertWordPieceLowerCase,
# bert-vocab.txt); mds trains GPTs, so those three name the GPT's. Its line lacks the `\` before
# `--save` (the shell would run `--save` as a command); the test joins them.
MERGE_004 = """
WORLD_SIZE=$TENSOR_MODEL_PARALLEL_SIZE python tools/merge_mp_partitions.py \\
--model-type GPT \\
--tensor-model-parallel-size $TENSOR_MODEL_PARALLEL_SIZE \\
--pipeline-model-parallel-size 1 \\
--target-pipeline-model-parallel-size $TARGET_PIPELINE_MODEL_PARALLEL_SIZE \\
--tokenizer-type GPT2BPETokenizer \\
--vocab-file $VOCAB_FILE \\
--num-layers 24 \\
--hidden-size 1024 \\
--num-attention-heads 16 \\
--seq-length 512 \\
--max-position-embeddings 512 \\
--load $CHECKPOINT_PATH \\
--save $CHECKPOINT_PATH/merged
"""

# 004, generate_samples_gpt.py, with GPT_ARGS "same as those in GPT pretraining above" (the 345M
# pretraining section's GPT_ARGS).
GENERATE_GPT_ARGS = """
--num-layers 24 \\
--hidden-size 1024 \\
--num-attention-heads 16 \\
--seq-length 1024 \\
--max-position-embeddings 1024 \\
--micro-batch-size 4 \\
--global-batch-size 8 \\
--lr 0.00015 \\
--train-iters 500000 \\
--lr-decay-iters 320000 \\
--lr-decay-style cosine \\
--vocab-file $VOCAB_FILE \\
--merge-file $MERGE_FILE \\
--lr-warmup-fraction .01 \\
--fp16 \\
"""
GENERATE_004 = """
python tools/generate_samples_gpt.py \\
$GPT_ARGS \\
--load $CHECKPOINT_PATH \\
--out-seq-length $MAX_OUTPUT_SEQUENCE_LENGTH \\
--temperature $TEMPERATURE \\
--genfile $OUTPUT_FILE \\
--num-samples $NUMBER_OF_SAMPLES \\
--top_p $TOP_P \\
--recompute
"""

SCRIPTS = {
    "pretrain_gpt.py": "mds-train",
    "tools/merge_mp_partitions.py": "mds-merge-mp",
    "tools/generate_samples_gpt.py": "mds-generate",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def expand(text: str, variables: dict[str, object]) -> str:
    """The shell's `$VAR` / `${VAR}` substitution, with the document's line continuations."""
    return Template(text.replace("\\\n", " ")).substitute({k: str(v) for k, v in variables.items()})


def assignments(text: str, variables: dict[str, object]) -> dict[str, str]:
    """The document's `NAME="..."` assignments, in order, each expanded with the ones before."""
    values = {key: str(value) for key, value in variables.items()}
    for line in expand_lines(text):
        name, _, value = line.removeprefix("export ").partition("=")
        values[name] = " ".join(shlex.split(Template(value).substitute(values)))
    return values


def expand_lines(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    lines, current = [], ""
    for line in joined.splitlines():  # a quoted value may span lines
        current = f"{current}\n{line}" if current else line
        if current.strip() and current.count('"') % 2 == 0:
            lines.append(current.strip())
            current = ""
    return lines


def scale(words: list[str], sizes: dict[str, str]) -> list[str]:
    """The words with each listed flag's value replaced; every listed flag must be there once."""
    words = list(words)
    for flag, value in sizes.items():
        assert words.count(flag) == 1, f"{flag} is not on the document's line once"
        words[words.index(flag) + 1] = value
    return words


def swap_script(words: list[str]) -> list[str]:
    """The document's script replaced by the mds tool (an executable the launchers can run)."""
    for index, word in enumerate(words):
        if word in SCRIPTS:
            tool = shutil.which(SCRIPTS[word]) or str(Path(sys.executable).with_name(SCRIPTS[word]))
            return [*words[:index], tool, *words[index + 1 :]]
    raise AssertionError(f"no script of {sorted(SCRIPTS)} in {words}")


def launcher_python(words: list[str]) -> list[str]:
    """`python` and `deepspeed` of the documents are this environment's."""
    bin_dir = Path(sys.executable).parent
    first = {"python": sys.executable, "python3": sys.executable}.get(words[0])
    if words[0] == "deepspeed":
        first = str(bin_dir / "deepspeed")
    return [first or words[0], *words[1:]]


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # CPU training takes the pure-torch paths
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", LOGLEVEL="WARNING", **extra)
    return env


def launch(words: list[str], *, env: dict[str, str] | None = None, timeout: float = 300):
    result = subprocess.run(
        launcher_python(swap_script(words)),
        env=env or environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    return output


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory) -> dict[str, Path]:
    """The documents' data/ folder: the shared golden dataset under the documents' names (links,
    so that the sample-index caches land here, not in the read-only shared folder)."""
    folder = tmp_path_factory.mktemp("data")
    for suffix in (".bin", ".idx"):
        (folder / f"meg-gpt2_text_document{suffix}").symlink_to(shared_data / f"{GOLDEN}{suffix}")
    return {
        "DATA_PATH": folder / "meg-gpt2_text_document",
        "VOCAB_FILE": shared_data / "megatron-golden/gpt2-tiny-vocab.json",
        "MERGE_FILE": shared_data / "megatron-golden/gpt2-tiny-merges.txt",
    }


def notes(output: str) -> None:
    if NO_GPU:
        assert output.count("--distributed-backend nccl: no GPU here; using gloo") == 1, output
    assert "Distributed package doesn't have NCCL" not in output


def metrics(folder: Path) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if json.loads(line)["event"] == "train"]


# The 345M's shape scaled down; the sequence also fits the 512 of merge_mp_partitions' line.
MODEL_345M = {
    "--num-layers": "2",
    "--hidden-size": "64",
    "--num-attention-heads": "4",
    "--seq-length": "64",
    "--max-position-embeddings": "64",
}


@pytest.fixture(scope="module")
def walkthrough(data, tmp_path_factory) -> Path:
    """000's first run: one process under torch.distributed.launch."""
    work = tmp_path_factory.mktemp("walkthrough")
    checkpoint = work / "checkpoints/gpt2"
    line = expand(
        WALKTHROUGH.replace("data/gpt2-vocab.json", "$VOCAB_FILE").replace(
            "data/gpt2-merges.txt", "$MERGE_FILE"
        ),
        {
            "DISTRIBUTED_ARGS": expand(
                WALKTHROUGH_DISTRIBUTED,
                dict(
                    GPUS_PER_NODE=1,
                    NNODES=1,
                    NODE_RANK=0,
                    MASTER_ADDR="localhost",
                    MASTER_PORT=_free_port(),
                ),
            ),  # fmt: skip
            "CHECKPOINT_PATH": checkpoint,
            **data,
        },
    )
    words = scale(
        shlex.split(line),
        {
            **MODEL_345M,
            "--micro-batch-size": "2",
            "--global-batch-size": "4",
            "--train-iters": "2",
            "--log-interval": "1",
            "--save-interval": "2",
            "--eval-interval": "2",
            "--eval-iters": "1",
        },
    )
    output = launch(words)
    notes(output)
    assert "--data-impl is accepted and ignored" in output
    assert (checkpoint / "latest").read_text().strip() == "global_step2"
    return checkpoint


def test_walkthrough_trains_and_the_generate_line_samples_from_it(walkthrough, data, tmp_path):
    """000's first run, then 004's generate_samples_gpt.py line with the pretraining GPT_ARGS."""
    records = metrics(walkthrough)
    assert [r["iteration"] for r in records] == [1, 2] and records[-1]["global_batch_size"] == 4
    gpt_args = expand(GENERATE_GPT_ARGS, data)
    line = expand(
        GENERATE_004,
        dict(GPT_ARGS=gpt_args, CHECKPOINT_PATH=walkthrough, MAX_OUTPUT_SEQUENCE_LENGTH=1024,
             TEMPERATURE=1.0, OUTPUT_FILE=tmp_path / "samples.json", NUMBER_OF_SAMPLES=2,
             TOP_P=0.9),
    )  # fmt: skip
    words = scale(shlex.split(line), {**MODEL_345M, "--out-seq-length": "16"})
    output = launch(words)
    for flag in ("--global-batch-size", "--lr", "--train-iters", "--lr-decay-iters",
                 "--lr-decay-style", "--lr-warmup-fraction"):  # fmt: skip
        assert output.count(f"{flag} is accepted and ignored") == 1, output
    samples = [json.loads(s) for s in (tmp_path / "samples.json").read_text().splitlines()]
    assert len(samples) == 2 and all(0 < s["length"] <= 16 for s in samples)
    # A model flag that is not the checkpoint's: one line.
    wrong = scale(words, {"--hidden-size": "32"})
    result = subprocess.run(
        launcher_python(swap_script(wrong)), env=environment(), capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stderr.splitlines()[-1] == (
        "mds-generate: error: --hidden-size 32, but the checkpoint's model has 64; drop the flag "
        "(the checkpoint says its shape)"
    )


def test_walkthrough_with_its_zero3_file(data, tmp_path):
    """000's DeepSpeed run: no --zero-stage given, the file's stage 3 is the run's (--fp16 alone
    would have meant 1); N_GPUS=4 and TP 4 become 2."""
    config_json = tmp_path / "deepspeed_config.json"
    config_json.write_text(ZERO3_CONFIG)
    checkpoint = tmp_path / "checkpoints/gpt2"
    values = assignments(
        ZERO3_ARGS, dict(CHECKPOINT_PATH=checkpoint, CONFIG_JSON=config_json, **data)
    )
    words = ["deepspeed", "--num_gpus", "2", "--master_port", str(_free_port()), "pretrain_gpt.py"]
    words += scale(
        shlex.split(values["ALL_ARGS"]),
        {
            **MODEL_345M,
            "--tensor-model-parallel-size": "2",
            "--global-batch-size": "2",
            "--train-iters": "2",
            "--log-interval": "1",
            "--save-interval": "2",
            "--eval-interval": "2",
            "--eval-iters": "1",
        },
    )
    output = launch(words)
    notes(output)
    assert "TP=2 PP=1 DP=1, ZeRO-3" in output, output
    resolved = json.loads((checkpoint / "config.json").read_text())["deepspeed_config"]
    assert resolved["zero_optimization"]["stage"] == 3
    assert resolved["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}
    assert (checkpoint / "latest").read_text().strip() == "global_step2"


def bigscience_variables(data, work: Path, config: dict) -> dict[str, object]:
    config_json = work / "ds_config.json"
    config_json.write_text(expand(BIGSCIENCE_CONFIG, config))
    return dict(
        CHECKPOINT_PATH=work / "checkpoints/gpt2",
        TENSORBOARD_PATH=work / "output_dir/tensorboard",
        config_json=config_json,
        **config,
        **data,
    )


# The ramp `2 2 1_000` becomes `2 2 2`: batch 2, then the global batch (4) from sample 2 on.
RAMP = "2 2 2"


@pytest.fixture(scope="module")
def bigscience_003(data, tmp_path_factory) -> Path:
    """003's run: torch.distributed.run, 2 processes, TP=2, ZeRO-1 from the file and the flag."""
    work = tmp_path_factory.mktemp("bigscience-003")
    config = dict(MICRO_BATCH_SIZE=1, GLOBAL_BATCH_SIZE=4, ZERO_STAGE=1)
    variables = dict(
        N_GPUS=2, TP_SIZE=2, PP_SIZE=1, NLAYERS=2, NHIDDEN=8, NHEADS=2, SEQ_LEN=32,
        TRAIN_SAMPLES=10, SAVE_INTERVAL=50, MASTER_ADDR="localhost", MASTER_PORT=_free_port(),
        **bigscience_variables(data, work, config),
    )  # fmt: skip
    words = shlex.split(assignments(BIGSCIENCE_003.replace("2 2 1_000", RAMP), variables)["CMD"])
    words = scale(words, {"--eval-iters": "1", "--log-interval": "1"})
    kill_switch = work / "kill-switch"
    words[words.index("/tmp/kill-switch")] = str(kill_switch)
    output = launch(words)
    notes(output)
    assert "TP=2 PP=1 DP=1, ZeRO-1" in output and "'train_batch_size'" not in output
    checkpoint = Path(variables["CHECKPOINT_PATH"])
    assert (checkpoint / "latest").read_text().strip() == "global_step3"
    return checkpoint


def test_bigscience_003_follows_the_ramp_and_the_files_loss_scaling(bigscience_003):
    # The ramp: 2 samples, then 4 (the file's train_batch_size) until --train-samples 10.
    assert [r["global_batch_size"] for r in metrics(bigscience_003)] == [2, 4, 4]
    resolved = json.loads((bigscience_003 / "config.json").read_text())
    assert resolved["config"]["precision"]["loss_scale_window"] == 500  # the file's, not 1000
    assert resolved["config"]["precision"]["initial_loss_scale"] == 4096
    assert resolved["deepspeed_config"]["train_batch_size"] == 2  # the ramp's start


def test_bigscience_004_with_deepspeed(data, tmp_path):
    """004's run: the deepspeed launcher, 2 processes, DP=2, ramp-up and ds_config.json."""
    config = dict(MICRO_BATCH_SIZE=1, GLOBAL_BATCH_SIZE=4, ZERO_STAGE=1)
    variables = dict(
        N_GPUS=2, TP_SIZE=1, PP_SIZE=1, SAVE_INTERVAL=100,
        **bigscience_variables(data, tmp_path, config),
    )  # fmt: skip
    words = shlex.split(assignments(BIGSCIENCE_004.replace("2 2 1_000", RAMP), variables)["CMD"])
    words = scale(
        words,
        {"--hidden-size": "16", "--seq-length": "32", "--max-position-embeddings": "32",
         "--train-samples": "10", "--eval-iters": "1", "--log-interval": "1"},
    )  # fmt: skip
    words[words.index("--num_gpus") : words.index("--num_gpus")] = [
        "--master_port",
        str(_free_port()),
    ]
    output = launch(words)
    notes(output)
    assert "TP=1 PP=1 DP=2, ZeRO-1" in output
    checkpoint = Path(variables["CHECKPOINT_PATH"])
    assert [r["global_batch_size"] for r in metrics(checkpoint)] == [2, 4, 4]


def test_merge_mp_partitions_line(bigscience_003, data):
    """004's merge line on 003's 2-way tensor-parallel checkpoint: to 2 pipeline stages."""
    variables = dict(
        TENSOR_MODEL_PARALLEL_SIZE=2, TARGET_PIPELINE_MODEL_PARALLEL_SIZE=2,
        CHECKPOINT_PATH=bigscience_003, VOCAB_FILE=data["VOCAB_FILE"],
    )  # fmt: skip
    words = shlex.split(expand(MERGE_004, variables))
    env = environment(**dict([words.pop(0).split("=", 1)]))  # WORLD_SIZE=2
    sizes = {"--num-layers": "2", "--hidden-size": "8", "--num-attention-heads": "2",
             "--seq-length": "32", "--max-position-embeddings": "32"}  # fmt: skip
    words = scale(words, sizes)
    output = launch(words, env=env)
    for flag in ("--tokenizer-type", "--vocab-file"):
        assert output.count(f"{flag} is accepted and ignored") == 1, output
    merged = bigscience_003 / "merged"
    meta = json.loads((merged / "global_step3/meta.json").read_text())
    assert (
        meta["parallel"]["pipeline_model_parallel_size"] == 2
        and meta["parallel"]["tensor_model_parallel_size"] == 1
    )
    # The source's layout and shape are checked: one line each.
    for flag, value, message in [
        ("--num-layers", "4", "--num-layers 4, but the checkpoint's model has 2; drop the flag"),
        ("--pipeline-model-parallel-size", "2", "the checkpoint was saved with PP=1"),
    ]:
        wrong = scale(words, {flag: value, "--save": str(bigscience_003 / "merged-again")})
        result = subprocess.run(
            launcher_python(swap_script(wrong)), env=env, capture_output=True, text=True
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and lines[-1].startswith("mds-merge-mp: error: "), lines
        assert message in lines[-1] and "Traceback" not in result.stderr
