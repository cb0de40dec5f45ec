"""mds-train continues upstream's own Llama-family run exactly: the shared golden
(`../shared/data/megatron-deepspeed-llama-golden/`, README there) is the TP=2 plain-engine fp32
ZeRO-1 checkpoint Megatron-DeepSpeed 6acc370a wrote at iteration 10 with the flag block of its
examples_deepspeed/pretrain_llama2_distributed.sh (4 heads, 2 key/value heads, SwiGLU, RMSNorm, no
linear biases, untied output layer, rotary); upstream's own `--load` of it logged iterations 11
and 12 (logs/tp2-resume.log)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

UPSTREAM_LOSSES = {11: 6.249592, 12: 6.201358}  # logs/tp2-resume.log, as upstream prints them
# The log prints 7 digits: 5e-7 of rounding at most, relative 8e-8 here; 2e-6 and 1e-5 are the
# issue's bounds (iteration 12 follows from the optimizer state loaded).
RTOL = {11: 2e-6, 12: 1e-5}
CORPUS = "corpus_text_document"


@pytest.fixture(scope="module")
def golden(shared_data) -> Path:
    return shared_data / "megatron-deepspeed-llama-golden"


def upstream_corpus(golden: Path, folder: Path) -> Path:
    """The golden's corpus as upstream wrote it. Upstream's preprocess_data.py --append-eod
    (6acc370a) leaves each document's end-of-document token out of the .idx's sizes while the .bin
    holds it, so the pointers drift a token per document and the .bin is 600 bytes (300 tokens)
    longer than the index covers; mds_indexed_data reads such a file as upstream's
    MMapIndexedDataset does, by the index alone (the samples are upstream's). A copy, so that
    nothing is ever written beside the shared files."""
    folder.mkdir()
    for suffix in (".idx", ".bin"):
        shutil.copyfile(golden / f"{CORPUS}{suffix}", folder / f"{CORPUS}{suffix}")
    assert (folder / f"{CORPUS}.bin").stat().st_size == 590_118  # else this note is stale
    return folder / CORPUS


def upstream_command_line(golden: Path, data: Path, cache: Path) -> list[str]:
    """The golden README's pretrain_gpt.py flags, paths changed (data, vocabulary, cache)."""
    return [
        *"--no-query-key-layer-scaling --attention-dropout 0 --hidden-dropout 0".split(),
        "--use-rotary-position-embeddings",
        *"--untie-embeddings-and-output-weights --swiglu --normalization rmsnorm".split(),
        *"--disable-bias-linear --num-key-value-heads 2".split(),
        *"--num-layers 2 --hidden-size 32 --ffn-hidden-size 64 --num-attention-heads 4".split(),
        *"--seq-length 128 --max-position-embeddings 128 --micro-batch-size 4".split(),
        *"--global-batch-size 8 --lr 1e-2 --min-lr 1e-3 --lr-decay-style cosine".split(),
        *"--lr-decay-iters 20 --lr-warmup-iters 2 --weight-decay 0.01 --clip-grad 1.0".split(),
        *"--adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --init-method-std 0.02".split(),
        *("--seed", "1234", "--data-path", str(data)),
        *("--vocab-file", str(golden / "vocab/vocab.json")),
        *("--merge-file", str(golden / "vocab/merges.txt")),
        *"--tokenizer-type GPT2BPETokenizer --split 949,50,1 --log-interval 1".split(),
        *"--eval-interval 1000 --eval-iters 1 --distributed-backend gloo".split(),
        *"--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1".split(),
        *"--no-pipeline-parallel --save-interval 10 --data-cache-path".split(),
        str(cache),
        *("--deepspeed", "--deepspeed_config", str(golden / "scripts/ds_zero1.json")),
        *"--zero-stage 1 --cpu-optimizer --cpu_torch_adam --no-masked-softmax-fusion".split(),
        *"--no-bias-gelu-fusion --no-bias-dropout-fusion --no-gradient-accumulation-fusion".split(),
    ]


@pytest.mark.multiprocess
@pytest.mark.parametrize(("tensor_parallel", "pipeline_parallel"), [(2, 1), (1, 1), (1, 2)])
def test_mds_train_continues_upstream_s_llama_run_exactly(
    runs, golden, tmp_path, tensor_parallel, pipeline_parallel
):
    """At upstream's layout (TP=2, ZeRO-1, 2 processes) DeepSpeed loads upstream's files as they
    are: weights (grouped QKV, [gate; up] rows, the untied output layer), ZeRO-1 Adam moments,
    the scheduler (--use-checkpoint-opt_param-scheduler, as upstream's resume) and RNG states.
    At TP=1, and at TP=1 x PP=2 (the pipeline engine, the head in its own LMHeadPipe), they are
    converted first (mds_checkpoint: the key/value groups, each rank's gate and up halves and both
    vocabulary-row tensors joined; the moments with them). Either way iterations 11 and 12 are
    upstream's."""
    checkpoint = tmp_path / "golden"
    shutil.copytree(golden / "tp2-ckpt", checkpoint)  # the shared copy stays as it is
    data = upstream_corpus(golden, tmp_path / "data")
    save = tmp_path / "save"
    flags = upstream_command_line(golden, data, tmp_path / "cache")
    flags[flags.index("--tensor-model-parallel-size") + 1] = str(tensor_parallel)
    flags[flags.index("--pipeline-model-parallel-size") + 1] = str(pipeline_parallel)
    if pipeline_parallel > 1:
        flags.remove("--no-pipeline-parallel")
    flags += ["--train-iters", "12", "--load", str(checkpoint), "--save", str(save)]
    flags += ["--use-checkpoint-opt_param-scheduler"]
    result = runs.train(flags, nproc=tensor_parallel * pipeline_parallel)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    as_they_are = "Megatron-DeepSpeed's files at this run's layout, loaded as they are"
    assert (as_they_are in result.stderr) == ((tensor_parallel, pipeline_parallel) == (2, 1))
    train = {r["iteration"]: r for r in runs.train_records(save)}
    assert sorted(train) == [11, 12]
    for iteration, loss in UPSTREAM_LOSSES.items():
        assert train[iteration]["lm_loss"] == pytest.approx(loss, rel=RTOL[iteration]), iteration
    # upstream's logged rates: cosine from the checkpoint's schedule at 88 and 96 samples
    assert train[11]["learning_rate"] == pytest.approx(5.5e-3, rel=1e-12)
    assert f"{train[12]['learning_rate']:.3E}" == "4.719E-03"
    meta = json.loads((save / "global_step12/meta.json").read_text())
    assert meta["model"]["untie_embeddings_and_output_weights"] is True
