"""Reshaping weights: the round trip over every layout is bit-identical, every layout computes the
same logits (TP=2 shards run as a real TP=2 model too), Megatron-DeepSpeed's and plain Megatron's
checkpoints load, and the written files are the layout mds-train's engines read."""

import argparse
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from mds_checkpoint import load_consolidated
from mds_checkpoint.config import ReshapeConfig
from mds_checkpoint.reshape import reshape
from mds_checkpoint.verify import fixed_batch, logits_of

LAYOUTS = [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2)]


def assert_same_weights(a, b, *, same_config=True):
    if same_config:
        assert a.config == b.config
    else:  # Megatron's args: the same shapes, spelled out (ffn_hidden_size, dropout, ...)
        assert (a.config.padded_vocab_size, a.config.ffn_size) == (
            b.config.padded_vocab_size,
            b.config.ffn_size,
        )
    assert list(a.state_dict) == list(b.state_dict)
    for name, tensor in a.state_dict.items():
        other = b.state_dict[name]
        assert tensor.dtype == other.dtype and torch.equal(tensor, other), name


def test_round_trip_over_every_layout_is_bit_identical(tp2pp2_checkpoint, tmp_path):
    start = load_consolidated(tp2pp2_checkpoint)
    tokens = fixed_batch(start)
    expected = logits_of(start, tokens)
    current = tp2pp2_checkpoint
    for tp, pp in LAYOUTS:
        out = tmp_path / f"tp{tp}-pp{pp}"
        reshape(
            ReshapeConfig(
                load=current,
                save=out,
                target_tensor_model_parallel_size=tp,
                target_pipeline_model_parallel_size=pp,
            )
        )
        folder = out / "global_step2"
        meta = json.loads((folder / "meta.json").read_text())
        assert (
            meta["parallel"]["tensor_model_parallel_size"],
            meta["parallel"]["pipeline_model_parallel_size"],
        ) == (
            tp,
            pp,
        )
        assert meta["iteration"] == 2 and meta["tool"] == "mds-merge-mp"
        assert (out / "latest").read_text() == "global_step2"
        mp_files = sorted(p.name for p in folder.glob("mp_rank_*_model_states.pt"))
        assert mp_files == [f"mp_rank_{m:02d}_model_states.pt" for m in range(tp * pp)]
        layer_files = sorted(p.name for p in folder.glob("layer_*"))
        if pp == 1:
            assert layer_files == []
            shard = torch.load(folder / "mp_rank_00_model_states.pt", weights_only=False)
            module = shard["module"]["language_model"]["encoder"]  # Megatron's nesting
            assert module["layers.0.self_attention.query_key_value.weight"].shape == (
                192 // tp,
                64,
            )
            assert shard["mds_train"]["state"]["iteration"] == 2
        else:  # 01 embedding, 02..05 layers, 06 final norm, for each TP rank
            assert len(layer_files) == 6 * tp
        model = load_consolidated(out)
        assert_same_weights(start, model)
        assert torch.equal(logits_of(model, tokens), expected)
        current = out


def test_tp2_shards_run_as_a_tp2_model_give_the_same_logits(tp2pp2_checkpoint, tmp_path):
    out = tmp_path / "tp2"
    reshape(ReshapeConfig(load=tp2pp2_checkpoint, save=out, target_tensor_model_parallel_size=2))
    whole = load_consolidated(out)
    tokens = fixed_batch(whole)
    torch.save(tokens, tmp_path / "tokens.pt")
    worker = Path(__file__).with_name("tp_worker.py")
    result = subprocess.run(
        [sys.executable, str(worker), str(out / "global_step2"), str(tmp_path / "tokens.pt"),
         str(tmp_path / "logits.pt")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    parallel = torch.load(tmp_path / "logits.pt")[..., : whole.config.vocab_size]
    torch.testing.assert_close(parallel, logits_of(whole, tokens), rtol=1e-5, atol=1e-5)


def test_the_cli_reshapes_and_verifies(merge_mp, tp2pp2_checkpoint, tmp_path):
    out = tmp_path / "out"
    result = merge_mp(
        "--load", tp2pp2_checkpoint, "--save", out, "--target-tensor-model-parallel-size", "1",
        "--target-pipeline-model-parallel-size", "4", "--verify",
        "--model-type", "GPT", "--tensor-model-parallel-size", "2",  # merge_mp_partitions' flags
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(f"wrote {out}/global_step2: TP=1 PP=4")
    verified = result.stdout.splitlines()[1]
    assert verified.startswith(
        "verify: largest logit difference 0; loss on 2 x 32 random token ids (not text) "
    )
    assert verified.endswith("(the source's too)")
    assert len(list((out / "global_step2").glob("layer_*"))) == 6


_RESHAPE_AND_LIST_IMPORTS = """
import sys
from mds_checkpoint.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit_:
    assert not exit_.code, exit_.code
print(sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "deepspeed")))
"""


def test_a_weights_reshape_never_imports_torch(tp2pp2_checkpoint, tmp_path):
    """mds-merge-mp reads and writes the .pt files with numpy (ptfile): torch's import would be
    as long as a 345M reshape's own work. The output is what torch itself loads."""
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", _RESHAPE_AND_LIST_IMPORTS, "--load", str(tp2pp2_checkpoint),
         "--save", str(out), "--target-tensor-model-parallel-size", "1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
    assert_same_weights(load_consolidated(tp2pp2_checkpoint), load_consolidated(out))
    state = torch.load(out / "global_step2" / "mp_rank_00_model_states.pt", weights_only=False)
    encoder = state["module"]["language_model"]["encoder"]
    assert encoder["layers.0.mlp.dense_h_to_4h.weight"].shape == (256, 64)


def _megatron_args(config, *, tp, pp):
    enums = types.ModuleType("megatron.enums")  # BS's enum, absent where the file is read

    class PositionEmbeddingType:
        __module__, __qualname__ = "megatron.enums", "PositionEmbeddingType"

        def __init__(self, value):
            self.value = value

        def __reduce__(self):
            return (PositionEmbeddingType, (self.value,))

    enums.PositionEmbeddingType = PositionEmbeddingType
    args = argparse.Namespace(
        num_layers=config.num_layers, hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads, seq_length=config.seq_length,
        max_position_embeddings=config.max_positions, ffn_hidden_size=config.ffn_size,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        padded_vocab_size=config.padded_vocab_size, make_vocab_size_divisible_by=128,
        bf16=True, fp16=False, position_embedding_type=PositionEmbeddingType(2),
        consumed_train_samples=16, consumed_valid_samples=0,
    )  # fmt: skip
    return args, enums


def _save_with_enums(obj, path, enums):
    megatron = types.ModuleType("megatron")
    sys.modules.update({"megatron": megatron, "megatron.enums": enums})
    try:
        torch.save(obj, path)
    finally:
        del sys.modules["megatron"], sys.modules["megatron.enums"]


def test_megatron_deepspeed_layer_files_load(tp2pp2_checkpoint, tmp_path):
    """Megatron-DeepSpeed's own checkpoint: the same layer files, no meta.json, its `args`
    (with BS's pickled enum) and checkpoint_info in the mp_rank files."""
    start = load_consolidated(tp2pp2_checkpoint)
    folder = tmp_path / "megatron-deepspeed" / "global_step2"
    folder.mkdir(parents=True)
    for path in (tp2pp2_checkpoint / "global_step2").glob("layer_*"):
        shutil.copy(path, folder / path.name)
    args, enums = _megatron_args(start.config, tp=2, pp=2)
    for m in range(4):
        state = {
            "module": None, "dp_world_size": 1, "mp_world_size": 4, "global_steps": 2,
            "args": args, "iteration": 2, "tokens": 512, "checkpoint_version": 3.0,
            "checkpoint_info": {"padded_vocab_size": 5120, "original_vocab_size": 5000},
        }  # fmt: skip
        _save_with_enums(state, folder / f"mp_rank_{m:02d}_model_states.pt", enums)
    (folder.parent / "latest").write_text("global_step2")
    model = load_consolidated(folder.parent)
    assert_same_weights(start, model, same_config=False)
    assert model.meta.iteration == 2 and model.meta.progress.consumed_train_samples == 16
    out = tmp_path / "reshaped"
    reshape(ReshapeConfig(load=folder.parent, save=out))
    assert_same_weights(start, load_consolidated(out), same_config=False)


def _megatron_model(state_dict, config, *, tp, rank, version, layers, first, last):
    """Megatron's nested `model` dict of one TP rank for the global layers `layers` (numbered
    from 0 in the file), checkpoint_version `version`; `first` holds the embedding, `last` the
    final norm (and, after other stages, the output layer's tied copy of the word embeddings)."""
    heads = config.num_attention_heads // tp

    def shard(name, tensor):
        split = 1 if name.endswith(("dense.weight", "dense_4h_to_h.weight")) else 0
        replicated = tensor.dim() == 1 and not name.endswith(("query_key_value.bias", "4h.bias"))
        if replicated or "position" in name:
            return tensor
        return tensor.chunk(tp, dim=split)[rank]

    encoder = {}
    for local_index, i in enumerate(layers):
        for name, tensor in state_dict.items():
            if name.startswith(f"layers.{i}."):
                local = name.split(".", 2)[2]
                piece = shard(name, tensor)
                if "query_key_value" in local and version == 0:  # rows [3, np, hn]
                    piece = piece.view(heads, 3, -1, *piece.shape[1:]).transpose(0, 1)
                    piece = piece.reshape(-1, *tensor.shape[1:]).contiguous()
                if version == 0:
                    local = local.replace("self_attention.", "attention.")  # the old spelling
                encoder[f"layers.{local_index}.{local}"] = piece
    language = {"transformer" if version == 0 else "encoder": encoder}
    words = {"weight": shard("w", state_dict["embedding.word_embeddings.weight"])}
    model = {"language_model": language}
    if first:
        language["embedding"] = {
            "word_embeddings": words,
            "position_embeddings": {"weight": state_dict["embedding.position_embeddings.weight"]},
        }
    if last:
        for name in ("final_layernorm.weight", "final_layernorm.bias"):
            encoder[name] = state_dict[name]
        if not first:
            model["word_embeddings_for_head"] = {"weight": words["weight"] + 1}  # never read
    return model


def test_plain_megatron_iter_folders_load(tp2pp2_checkpoint, tmp_path):
    """`iter_0000002/mp_rank_TT_PPP/model_optim_rng.pt` with the tracker file, in checkpoint
    version 0 (QKV rows [3, heads, head_dim], the `attention.` and `transformer` spellings)."""
    start = load_consolidated(tp2pp2_checkpoint)
    args, enums = _megatron_args(start.config, tp=2, pp=2)
    for stage in range(2):
        for rank in range(2):
            folder = tmp_path / "megatron" / "iter_0000002" / f"mp_rank_{rank:02d}_{stage:03d}"
            folder.mkdir(parents=True)
            model = _megatron_model(
                start.state_dict, start.config, tp=2, rank=rank, version=0,
                layers=range(2 * stage, 2 * stage + 2), first=stage == 0, last=stage == 1,
            )  # fmt: skip
            state = {"model": model, "args": args, "iteration": 2, "checkpoint_version": 0}
            _save_with_enums(state, folder / "model_optim_rng.pt", enums)
    (tmp_path / "megatron" / "latest_checkpointed_iteration.txt").write_text("2")
    model = load_consolidated(tmp_path / "megatron")
    assert_same_weights(start, model, same_config=False)
    assert model.meta.iteration == 2


def test_plain_megatron_virtual_pipeline_stages_load(tp2pp2_checkpoint, tmp_path):
    """Interleaved schedule, 4 layers over PP=2 with 2 virtual stages: stage 0 holds layers [0]
    [2] as `model0`, `model1`, stage 1 [1] [3] (Megatron's `ParallelTransformer` offset
    c * (L / V) + p * (L / (P * V))); each chunk numbers its layers from 0."""
    start = load_consolidated(tp2pp2_checkpoint)
    args, enums = _megatron_args(start.config, tp=2, pp=2)
    args.virtual_pipeline_model_parallel_size = 2
    written = {}
    for stage in range(2):
        for rank in range(2):
            folder = tmp_path / "megatron" / "iter_0000002" / f"mp_rank_{rank:02d}_{stage:03d}"
            folder.mkdir(parents=True)
            state = {"args": args, "iteration": 2, "checkpoint_version": 3.0}
            for chunk in range(2):
                state[f"model{chunk}"] = _megatron_model(
                    start.state_dict, start.config, tp=2, rank=rank, version=3,
                    layers=[chunk * 2 + stage], first=(stage, chunk) == (0, 0),
                    last=(stage, chunk) == (1, 1),
                )  # fmt: skip
            _save_with_enums(state, folder / "model_optim_rng.pt", enums)
            written[(stage, rank)] = folder, state
    (tmp_path / "megatron" / "latest_checkpointed_iteration.txt").write_text("2")
    model = load_consolidated(tmp_path / "megatron")
    assert_same_weights(start, model, same_config=False)
    out = tmp_path / "reshaped"
    reshape(
        ReshapeConfig(load=tmp_path / "megatron", save=out, target_pipeline_model_parallel_size=2)
    )
    reshaped = load_consolidated(out)
    assert_same_weights(start, reshaped, same_config=False)
    tokens = fixed_batch(start)  # without checkpoint_info every padded row counts as a token
    logits = logits_of(reshaped, tokens)[..., : start.config.vocab_size]
    assert torch.equal(logits, logits_of(start, tokens))
    args.virtual_pipeline_model_parallel_size = 4  # the files must agree with the args
    folder, state = written[(0, 0)]
    _save_with_enums(state, folder / "model_optim_rng.pt", enums)
    with pytest.raises(ValueError, match="2 model chunks, virtual_pipeline_model_parallel_size 4"):
        load_consolidated(tmp_path / "megatron")
