"""Files that earlier mds code wrote (tests/e2e/written_files/COMMIT, see its README) still read
with the current tools: datasets and their sidecars, mds-train checkpoints (resumed on the same
losses), pipeline and Megatron layouts, and Hugging Face exports. Each test works on a copy in
tmp_path.

The losses and logits in expected.json were computed on another CPU: compared within 1e-4."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mds_checkpoint import load_consolidated
from mds_model import GPT

WRITTEN = Path(__file__).resolve().parent / "written_files"
FOLDERS = sorted(path.name for path in WRITTEN.iterdir() if path.is_dir())
RTOL = 1e-4
TRAIN_FLAGS = (
    "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 32 "
    "--max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4 --lr 1e-2 "
    "--min-lr 1e-3 --lr-decay-style cosine --lr-warmup-iters 2 --hidden-dropout 0 "
    "--attention-dropout 0 --seed 1234 --split 100,0,0 --eval-iters 0 --log-interval 1 "
    "--zero-stage 1 --train-iters 6"
).split()


@pytest.fixture(params=FOLDERS)
def files(request, tmp_path) -> Path:
    copy = tmp_path / request.param
    shutil.copytree(WRITTEN / request.param, copy)
    return copy


def tool(*command, expect_ok: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, env=env, check=False
    )
    if expect_ok:
        assert result.returncode == 0, f"{command} failed:\n{result.stderr[-3000:]}"
    return result


def tokenizer_flags(files: Path) -> list:
    return ["--vocab-file", files / "vocab/vocab.json", "--merge-file", files / "vocab/merges.txt"]


def logits(checkpoint: Path) -> torch.Tensor:
    consolidated = load_consolidated(checkpoint)
    model = GPT(consolidated.config)
    model.load_state_dict(consolidated.state_dict)
    with torch.no_grad():
        return model.eval().logits(torch.arange(64).reshape(2, 32) % 300)


def test_datasets_merge_by_their_recorded_vocabulary(files, tmp_path, shared_data):
    """merge reads the old sidecars' vocabulary (moved files: matched by content) and still
    refuses a dataset made with another one."""
    fresh = tmp_path / "fresh"
    tool("mds-tokenize", "--input", files / "corpus.jsonl", "--output-prefix", fresh,
         *tokenizer_flags(files), "--append-eod", "--workers", "1")  # fmt: skip
    tool("mds-index", "merge", "--datasets", files / "corpus_text_document", files / "merged",
         f"{fresh}_text_document", "--output-prefix", tmp_path / "all")  # fmt: skip
    other = tmp_path / "other"
    tool("mds-tokenize", "--input", files / "corpus.jsonl", "--output-prefix", other,
         "--vocab-file", shared_data / "megatron-golden/gpt2-tiny-vocab.json",
         "--merge-file", shared_data / "megatron-golden/gpt2-tiny-merges.txt",
         "--append-eod", "--workers", "1")  # fmt: skip
    refused = tool("mds-index", "merge", "--datasets", files / "merged", f"{other}_text_document",
                   "--output-prefix", tmp_path / "mixed", expect_ok=False)  # fmt: skip
    assert refused.returncode == 1 and "vocabular" in refused.stderr, refused.stderr


def test_checkpoint_resumes_on_its_losses(files, tmp_path):
    expected = json.loads((files / "expected.json").read_text())["resumed_losses"]
    run = tmp_path / "run"
    tool(sys.executable, "-m", "mds_train", *TRAIN_FLAGS, *tokenizer_flags(files),
         "--data-path", files / "corpus_text_document", "--data-cache-path", tmp_path / "cache",
         "--load", files / "checkpoint", "--output-dir", run)  # fmt: skip
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {str(r["iteration"]): r["lm_loss"] for r in records if "lm_loss" in r}
    assert losses.keys() == expected.keys()
    for iteration, loss in expected.items():
        assert losses[iteration] == pytest.approx(loss, rel=RTOL), iteration


def test_every_layout_reads_to_the_same_function(files):
    expected = json.loads((files / "expected.json").read_text())
    reference = logits(files / "checkpoint")
    assert float(reference.abs().sum()) == pytest.approx(expected["logits_sum_abs"], rel=RTOL)
    assert reference[0, 0, :8].tolist() == pytest.approx(expected["logits_first_row"], abs=1e-5)
    torch.testing.assert_close(logits(files / "megatron"), reference, rtol=0, atol=1e-6)
    assert logits(files / "pipeline").shape == reference.shape


def test_tools_read_the_checkpoints(files, tmp_path, runs):
    from mds_checkpoint.cli import main as merge_mp
    from mds_generate.cli import main as generate

    def ok(main, *args) -> str:
        result = runs.in_process(main, *args)
        assert result.returncode == 0, f"{args} failed:\n{result.stderr[-3000:]}"
        return result.stdout

    ok(merge_mp, "--load", files / "pipeline", "--save", tmp_path / "tp1",
       "--target-tensor-model-parallel-size", "1", "--target-pipeline-model-parallel-size", "1",
       "--verify")  # fmt: skip
    ok(merge_mp, "export-hf", "--load", files / "megatron", "--save", tmp_path / "hf", "--verify")
    for load in (files / "checkpoint", files / "pipeline", files / "hf"):
        out = ok(generate, "--load", load, *tokenizer_flags(files), "--prompt", "The",
                 "--max-new-tokens", "4", "--greedy", "--device", "cpu")  # fmt: skip
        assert out.strip(), load
