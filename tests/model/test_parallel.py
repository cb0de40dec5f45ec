"""TP=2 and PP=2 (DeepSpeed pipeline engine) equal the single-process model; gloo on CPU."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).with_name("dist_worker.py")
FP32_TOL = 1e-5


def launch(modes: list[str], num_procs: int, out: Path) -> dict[str, list[dict]]:
    """dist_worker.py's `modes` in one torchrun launch: each mode's per-rank results."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={num_procs}",
            str(WORKER),
            ",".join(modes),
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {
        mode: [json.loads((out / mode / f"rank{r}.json").read_text()) for r in range(num_procs)]
        for mode in modes
    }


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[dict[str, list[dict]], Path]:
    """The 2-rank modes, one launch for all of them (a torchrun start-up costs seconds)."""
    out = tmp_path_factory.mktemp("two-ranks")
    return launch(["tp", "llama", "pp", "llama_pp"], 2, out), out


def test_tp2_equals_tp1_logits_loss_and_every_gradient(two_ranks):
    results = two_ranks[0]["tp"]
    for rank_result in results:
        for key in ("dropout", "dropout_sequence_parallel"):
            dropout = rank_result.pop(key)
            # Replicated activations and gradients stay identical on the TP ranks ...
            assert dropout["logits_across_ranks"] == 0.0, key
            assert dropout["loss_across_ranks"] == 0.0, key
            assert dropout["replicated_grads_across_ranks"] < 1e-7, key
            # ... while dropout on each rank's heads (or sequence slice) uses its own state.
            assert dropout["tracked_draws_across_ranks"] > 0.0, key
            assert dropout["vs_shared_tracker_seed"] > 1e-3, key
        assert set(rank_result) == {
            "learned",
            "alibi_embed_layernorm",
            "rotary_selective",
            "learned_full_ckpt",
            "sequence_parallel",
            "sequence_parallel_alibi_selective",
        }
        for variant, r in rank_result.items():
            assert r["weights"] == 0.0, f"{variant}: TP init differs from the TP=1 master weights"
            assert r["logits"] < FP32_TOL, variant
            assert r["loss"] < FP32_TOL, variant
            assert r["num_params"] >= 27
            bad = {name: d for name, d in r["grads"].items() if d >= FP32_TOL}
            assert not bad, f"{variant}: gradients differ {bad}"


@pytest.fixture(scope="module")
def pp2_run(two_ranks):
    results, out = two_ranks
    return results["pp"], out / "pp"


def test_pp2_pipeline_engine_equals_plain_model(pp2_run):
    results, _ = pp2_run
    stage0, stage1 = results
    assert (stage0["stage"], stage1["stage"]) == (0, 1)
    for r in results:
        assert r["weights"] == 0.0  # per-layer init seeds: a layer is the same on any stage
        assert r["loss"] < FP32_TOL
        bad = {name: d for name, d in r["grads"].items() if d >= FP32_TOL}
        assert not bad, f"stage {r['stage']}: gradients differ {bad}"
    # Stage 0 owns embedding + 2 layers; stage 1 the 2 other layers, final norm and the tied head.
    assert any(name.startswith("tied_modules.embed.word") for name in stage1["grads"])
    assert "6.weight" in stage1["grads"] and "2.input_layernorm.weight" in stage0["grads"]


def test_pipe_checkpoint_files_have_megatron_deepspeed_names(pp2_run):
    _, out = pp2_run
    folder = out / "ckpt" / "global_step1"
    names = sorted(p.name for p in folder.iterdir())
    # N = 4 layers in deepspeedai/Megatron-DeepSpeed's GPTModelPipe numbering: embedding at 1,
    # layers at 2..5, final norm at N+2 = 6; the head (tied) has no file.
    assert names == [
        "layer_01-model_00-model_states.pt",
        "layer_02-model_00-model_states.pt",
        "layer_03-model_00-model_states.pt",
        "layer_04-model_00-model_states.pt",
        "layer_05-model_00-model_states.pt",
        "layer_06-model_00-model_states.pt",
        "mp_rank_00_model_states.pt",
        "mp_rank_01_model_states.pt",
    ]
    assert (out / "ckpt" / "latest").read_text() == "global_step1"
    layer = torch.load(folder / "layer_02-model_00-model_states.pt", weights_only=True)
    assert sorted(layer) == sorted(
        f"{module}.{kind}"
        for module in (
            "input_layernorm",
            "self_attention.query_key_value",
            "self_attention.dense",
            "post_attention_layernorm",
            "mlp.dense_h_to_4h",
            "mlp.dense_4h_to_h",
        )
        for kind in ("weight", "bias")
    )
    assert layer["self_attention.query_key_value.weight"].shape == (96, 32)
    embedding = torch.load(folder / "layer_01-model_00-model_states.pt", weights_only=True)
    assert sorted(embedding) == ["position_embeddings.weight", "word_embeddings.weight"]
    assert embedding["word_embeddings.weight"].shape == (256, 32)
    final = torch.load(folder / "layer_06-model_00-model_states.pt", weights_only=True)
    assert sorted(final) == ["bias", "weight"]


def test_tp2_pp2_equals_plain_model_and_splits_files(tmp_path):
    results = launch(["tppp"], 4, tmp_path)["tppp"]
    assert [(r["stage"], r["tp_rank"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in results:
        assert r["weights"] == 0.0
        assert r["loss"] < FP32_TOL
        bad = {name: d for name, d in r["grads"].items() if d >= FP32_TOL}
        assert not bad, f"stage {r['stage']} tp {r['tp_rank']}: gradients differ {bad}"
    folder = tmp_path / "tppp" / "ckpt" / "global_step1"
    qkv = [
        torch.load(folder / f"layer_04-model_{tp:02d}-model_states.pt", weights_only=True)[
            "self_attention.query_key_value.weight"
        ]
        for tp in (0, 1)
    ]
    assert [t.shape for t in qkv] == [(48, 32), (48, 32)]
    assert sorted(p.name for p in folder.glob("mp_rank_*")) == [
        f"mp_rank_{m:02d}_model_states.pt" for m in range(4)
    ]


@pytest.mark.parametrize("mode", ["llama", "llama_pp"])
def test_llama_tp2_and_pp2_equal_transformers_llama(two_ranks, mode):
    """TP=2 (sequence parallel, selective recompute) and PP=2 (DeepSpeed's pipeline engine, full
    recompute, the untied head in its own LMHeadPipe) against LlamaForCausalLM holding the same
    weights (tests/model/llama_hf.py): loss, logits and every gradient."""
    results = two_ranks[0][mode]
    for r in results:
        assert r["weights"] == 0.0, "the shards are not the TP=1 master weights' blocks"
        assert r["loss"] < FP32_TOL
        assert r.get("logits", 0.0) < FP32_TOL
        bad = {name: d for name, d in r["grads"].items() if d >= FP32_TOL}
        assert not bad, f"gradients differ {bad}"
    names = {name for r in results for name in r["grads"]}
    if mode == "llama_pp":  # the head is untied: its own spec (N + 3 = 7), no tied embedding
        assert "7.lm_head.weight" in names and "1.word_embeddings.weight" in names
        assert not any(name.startswith("tied_modules") for name in names)
    else:
        assert "output_layer.weight" in names
