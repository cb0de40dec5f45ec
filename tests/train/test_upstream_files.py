"""mds-train's checkpoint files as upstream's tools read them.

- Megatron-DeepSpeed's readers take a missing `checkpoint_version` for 0 and then reorder the
  query/key/value rows (megatron/checkpointing.py `fix_query_key_value_ordering`; Hugging Face's
  `convert_megatron_gpt2_checkpoint.py` alike), so mds-train writes 3.0 (rows per head, as
  Megatron's version >= 2), with `args`, `iteration` and `tokens` as upstream's
  `save_checkpoint` does.
- DeepSpeed's own `ds_to_universal` (deepspeed/checkpoint/ds_to_universal.py) needs
  `universal_checkpoint_info` and classifies parameters by its patterns; run on an mds-train
  ZeRO-1 pipeline checkpoint, it gives the fp32 masters and Adam moments mds-merge-mp reads, bit
  for bit (DeepSpeed's universal files hold the unpadded vocabulary rows). Not on a plain-engine
  (PP = 1) checkpoint: DeepSpeed 0.19.8's ds_to_universal then saves every top-level entry of
  `module` as a tensor (`tensor.float()` of the nested `language_model` dict: AttributeError), on
  upstream's own `--no-pipeline-parallel` checkpoints (the golden) as on mds-train's, which must
  nest `module` as upstream does for upstream's `GPTModel.load_state_dict` to read it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mds_checkpoint import ptfile
from mds_checkpoint.cli import main as merge_mp
from mds_checkpoint.engine_names import megatron_to_plain


@pytest.fixture(scope="module")
def zero1_checkpoint(runs, shared_data, data_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zero1")
    flags = [
        *runs.MODEL,
        *runs.OPTIMIZER,
        *runs.data_flags(shared_data, data_cache),
        *"--train-iters 2 --lr-decay-iters 20 --eval-iters 0 --zero-stage 1 --save".split(),
        str(out / "checkpoints"),
    ]
    result = runs.train(flags)
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "checkpoints" / "global_step2"


def test_rank_files_carry_upstream_s_keys(zero1_checkpoint):
    state = ptfile.load(zero1_checkpoint / "mp_rank_00_model_states.pt")
    assert state["checkpoint_version"] == 3.0
    assert (state["iteration"], state["tokens"]) == (2, 2 * 8 * 64)
    args = state["args"]
    assert (args.num_layers, args.hidden_size, args.num_attention_heads) == (2, 64, 4)
    assert (args.padded_vocab_size, args.tensor_model_parallel_size) == (5120, 1)
    info = state["universal_checkpoint_info"]
    assert (info["original_vocab_size"], info["padded_vocab_size"]) == (5000, 5120)
    # Upstream's GPTModel names, which ds_to_universal matches these patterns against.
    assert info["vocabulary_parameter_patterns"] == [
        "language_model.embedding.word_embeddings.weight"
    ]
    assert next(iter(state["param_shapes"][0])) == "language_model.embedding.word_embeddings.weight"


def test_rank_files_hold_what_upstream_s_load_checkpoint_reads(zero1_checkpoint):
    """deepspeedai's load path (megatron/checkpointing.py `load_checkpoint`, DeepSpeed's engine
    `load_checkpoint`): `module` is the nested dict its `GPTModel.load_state_dict` takes
    (`language_model` -> `embedding` / `encoder`); `lr_scheduler` goes into its
    `OptimizerParamScheduler.load_state_dict`, which reads these keys; `rng_state[0]` is set as
    upstream sets it (it exits unless every key is there and the tracker states are not empty)."""
    state = ptfile.load(zero1_checkpoint / "mp_rank_00_model_states.pt")
    language = state["module"]["language_model"]
    assert sorted(language) == ["embedding", "encoder"]
    assert sorted(language["embedding"]) == ["position_embeddings", "word_embeddings"]
    assert language["embedding"]["word_embeddings"]["weight"].shape == (5120, 64)
    encoder = language["encoder"]
    assert "layers.1.self_attention.query_key_value.weight" in encoder
    assert "final_layernorm.weight" in encoder
    scheduler = state["lr_scheduler"]
    global_batch = 8
    assert scheduler["num_steps"] == 2 * global_batch  # samples of the applied steps
    assert scheduler["num_tokens"] == global_batch * 64  # lags one iteration, as upstream's
    for key in ("max_lr", "min_lr", "lr_warmup_steps", "lr_warmup_tokens", "lr_decay_steps",
                "lr_decay_tokens", "lr_decay_style", "start_wd", "end_wd", "wd_incr_style",
                "wd_incr_steps"):  # fmt: skip
        assert key in scheduler, key
    assert scheduler["lr_decay_steps"] == 20 * global_batch
    (rng,) = state["rng_state"]
    assert sorted(rng) == [
        "cuda_rng_state", "np_rng_state", "random_rng_state", "rng_tracker_states",
        "torch_rng_state",
    ]  # fmt: skip
    assert list(rng["rng_tracker_states"]) == ["model-parallel-rng"]
    assert np.asarray(rng["rng_tracker_states"]["model-parallel-rng"]).dtype == np.uint8


@pytest.fixture(scope="module")
def pipeline_zero1_checkpoint(runs, shared_data, data_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pipeline_zero1")
    flags = [
        *runs.MODEL,
        *runs.OPTIMIZER,
        *runs.data_flags(shared_data, data_cache),
        *"--train-iters 2 --lr-decay-iters 20 --eval-iters 0 --zero-stage 1".split(),
        *"--pipeline-model-parallel-size 2 --save".split(),
        str(out / "checkpoints"),
    ]
    result = runs.train(flags, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "checkpoints" / "global_step2"


@pytest.mark.multiprocess
def test_deepspeed_s_ds_to_universal_reads_mds_train_s_checkpoint(
    runs, pipeline_zero1_checkpoint, tmp_path
):
    checkpoint = pipeline_zero1_checkpoint
    universal = tmp_path / "universal"
    runs.ds_to_universal(checkpoint, universal)
    ours = tmp_path / "mds"
    with pytest.raises(SystemExit) as exit_:
        merge_mp(["--load", str(checkpoint), "--save", str(ours), "--with-optimizer",
                  "--target-pipeline-model-parallel-size", "2"])  # fmt: skip
    assert exit_.value.code == 0
    names = sorted(p.name for p in (universal / "zero").iterdir() if p.is_dir())
    assert len(names) == 28
    # Both name the folders as the pipeline engine names the parameters.
    assert names == sorted(p.name for p in (ours / "global_step2/zero").iterdir() if p.is_dir())
    for name in names:
        for key in ("fp32", "exp_avg", "exp_avg_sq", "step"):
            theirs = torch.load(universal / "zero" / name / f"{key}.pt", weights_only=False)
            mine = torch.load(ours / "global_step2/zero" / name / f"{key}.pt", weights_only=False)
            if key == "step":
                assert torch.equal(theirs, mine) and int(theirs) == 2, name
                continue
            rows = theirs["param"].shape[0]  # DeepSpeed's: the unpadded vocabulary
            assert torch.equal(theirs["param"], mine["param"][:rows]), (name, key)
            assert theirs.get("vocab_tensor") == mine.get("vocab_tensor"), (name, key)
            # cat_dim: mds writes every split parameter's (names.split_of: 1 for row-parallel
            # weights), none for replicated ones; ds_to_universal takes it from the patterns of
            # universal_checkpoint_info, which (as upstream's) name row-parallel weights only at
            # TP > 1, so from this TP = 1 checkpoint it writes 0 for every parameter
            assert set(theirs) - set(mine) <= {"cat_dim"}, (name, key)


def test_the_save_folder_s_zero_to_fp32_gives_the_weights(zero1_checkpoint, tmp_path):
    """DeepSpeed's engine copies its zero_to_fp32.py beside the checkpoints, as for upstream's
    runs; run there, it rebuilds the fp32 weights mds reads from the same files."""
    from mds_checkpoint import load_consolidated

    save = zero1_checkpoint.parent
    out = tmp_path / "fp32"
    result = subprocess.run(
        [sys.executable, str(save / "zero_to_fp32.py"), str(save), str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rebuilt = torch.load(out / "pytorch_model.bin", weights_only=False)
    ours = load_consolidated(save).state_dict
    rebuilt = {megatron_to_plain(name): tensor for name, tensor in rebuilt.items()}
    assert sorted(rebuilt) == sorted(ours)
    for name, tensor in ours.items():
        assert torch.equal(rebuilt[name], tensor.float()), name
