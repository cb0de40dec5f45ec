"""`mds-merge-mp --target-layout`: what mds writes, read the way upstream's code reads it.

- Hugging Face's own converter, transformers' `convert_megatron_gpt2_checkpoint.py`, vendored
  unmodified in third_party/ (origin and licence in its README; transformers' wheels no longer
  ship it) and run through its `main()`: a missing `checkpoint_version` is 0.0; its version >= 2.0
  rule regroups per-head `[np, 3, hn]` rows to `[3, np, hn]`, version 0 leaves them;
- no Megatron code runs here (CI has none); its rules are written out in this file, each cited:
  deepspeedai/Megatron-DeepSpeed `megatron/checkpointing.py` (`check_checkpoint_args`,
  `load_args_from_checkpoint`, `fix_query_key_value_ordering`, `read_metadata`,
  `get_checkpoint_name`) and `megatron/model/gpt_model.py` (`UniversalCheckpointInfo`),
  compared against the golden checkpoint upstream wrote (../shared/data/megatron-deepspeed-golden);
- DeepSpeed's own loader, imported: `deepspeed.runtime.state_dict_factory.SDLoaderFactory` /
  `MegatronSDLoader`, as `PipelineModule.load_state_dir` and the engine's `_load_checkpoint`
  call it.
Round trips: every layout read back by `load_consolidated`, bit for bit, from a TP=2 and a PP=2
source (the golden, and the golden reshaped to PP=2).
"""

from __future__ import annotations

import argparse
import enum
import importlib.util
import json
import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers  # a dev dependency: the independent GPT-2
from deepspeed.runtime.state_dict_factory import SDLoaderFactory
from mds_checkpoint import load_consolidated
from mds_checkpoint.cli import main

LAYOUTS = ("mds", "deepspeedai", "bigscience", "megatron")
REAL_VOCAB = 50257


@pytest.fixture(scope="module")
def golden(shared_data) -> Path:
    return shared_data / "megatron-deepspeed-golden" / "tp2-pp1-ckpt"


@pytest.fixture(scope="module", autouse=True)
def megatron_modules():
    """The Megatron classes upstream's `args` pickle, importable so that torch.load reads them:
    the golden's `megatron.core.enums.ModelType` (megatron/core/enums.py) and bigscience's
    `megatron.enums.PositionEmbeddingType` (its megatron/enums.py: rotary 1, absolute 2, alibi 3),
    which mds writes into a bigscience layout's args."""
    core = types.ModuleType("megatron.core.enums")
    core.ModelType = enum.Enum(
        "ModelType", "encoder_or_decoder encoder_and_decoder retro_encoder retro_decoder"
    )
    core.ModelType.__module__ = core.__name__
    enums = types.ModuleType("megatron.enums")
    enums.PositionEmbeddingType = enum.Enum("PositionEmbeddingType", "rotary absolute alibi")
    enums.PositionEmbeddingType.__module__ = enums.__name__
    modules = {
        "megatron": types.ModuleType("megatron"),
        "megatron.core": types.ModuleType("megatron.core"),
        "megatron.core.enums": core,
        "megatron.enums": enums,
    }
    assert not set(modules) & set(sys.modules)
    sys.modules.update(modules)
    yield enums
    for name in modules:
        del sys.modules[name]


def merge(*args) -> None:
    try:
        main([str(arg) for arg in args])
    except SystemExit as exit_:
        assert not exit_.code, exit_.code


def reshape(source: Path, out: Path, *, tp: int, pp: int, layout: str) -> Path:
    merge(
        *("--load", source, "--save", out, "--target-layout", layout),
        *("--target-tensor-model-parallel-size", tp, "--target-pipeline-model-parallel-size", pp),
    )
    return out


@pytest.fixture(scope="module")
def golden_pp2(golden, tmp_path_factory) -> Path:
    """A PP=2 source: the golden (TP=2, plain engine) reshaped to mds-train's TP=1 x PP=2."""
    return reshape(golden, tmp_path_factory.mktemp("pp2") / "ckpt", tp=1, pp=2, layout="mds")


def torch_load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)


# ---------------------------------------------------------------------------------------------
# (a) Hugging Face's convert_megatron_gpt2_checkpoint.py, vendored unmodified in third_party/


@pytest.fixture(scope="module")
def hf_script() -> types.ModuleType:
    """The script as a module (pytest runs with --import-mode=importlib; tests/ is no package)."""
    path = Path(__file__).with_name("third_party") / "convert_megatron_gpt2_checkpoint.py"
    spec = importlib.util.spec_from_file_location("convert_megatron_gpt2_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_hf_script(script, checkpoint: Path, shared_data: Path, monkeypatch) -> Path:
    """The script's `main()` on one `model_optim_rng.pt`, as `python convert_megatron_gpt2_
    checkpoint.py FILE` runs it: it writes config.json, the tokenizer and pytorch_model.bin into
    FILE's folder, which is returned. Two things of today's environment are supplied around it:
    - its `AutoTokenizer.from_pretrained("openai-community/gpt2")` downloads from the hub, which
      tests cannot reach: the script's `AutoTokenizer` name is given GPT-2's own vocab/merges;
    - it calls `torch.load` without `weights_only` (the default was False in the torch of its
      day, True since 2.6): the checkpoint's `args` (an argparse.Namespace) is allowed in."""

    def gpt2_tokenizer(name: str) -> transformers.GPT2Tokenizer:
        assert name == "openai-community/gpt2", name  # args.tokenizer_type GPT2BPETokenizer
        vocab, merges = shared_data / "gpt2-vocab.json", shared_data / "gpt2-merges.txt"
        return transformers.GPT2Tokenizer(str(vocab), str(merges))

    monkeypatch.setattr(
        script, "AutoTokenizer", types.SimpleNamespace(from_pretrained=gpt2_tokenizer)
    )
    monkeypatch.setattr(sys, "argv", ["convert_megatron_gpt2_checkpoint.py", str(checkpoint)])
    with torch.serialization.safe_globals([argparse.Namespace]):
        script.main()
    return checkpoint.parent


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    model, info = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"], info  # the script also writes GPT-2's old mask buffers
    model.eval()
    with torch.no_grad():
        return model(tokens).logits[0, :, :REAL_VOCAB]  # its vocabulary is the padded one


@pytest.fixture(scope="module")
def tokens(golden) -> torch.Tensor:
    fixed = np.load(golden.parent / "logits" / "fixed_tokens.npy")
    return torch.from_numpy(fixed[:64].astype(np.int64))[None]


@pytest.fixture(scope="module")
def exported(golden, shared_data, tmp_path_factory) -> Path:
    hf = tmp_path_factory.mktemp("hf") / "gpt2"
    merge(
        *("export-hf", "--load", golden, "--save", hf),
        *("--vocab-file", shared_data / "gpt2-vocab.json"),
        *("--merge-file", shared_data / "gpt2-merges.txt"),
    )
    return hf


def test_export_hf_states_vocabulary_tokens_and_ships_the_tokenizer(exported, shared_data):
    """config.json: the real vocabulary (50257, not the padded 50432) and GPT-2's end-of-text as
    BOS/EOS, for a Megatron source with no meta.json; vocab.json / merges.txt beside it."""
    config = json.loads((exported / "config.json").read_text())
    assert config["vocab_size"] == REAL_VOCAB
    assert config["bos_token_id"] == config["eos_token_id"] == 50256
    assert (exported / "vocab.json").read_bytes() == (shared_data / "gpt2-vocab.json").read_bytes()
    assert (exported / "merges.txt").read_bytes() == (shared_data / "gpt2-merges.txt").read_bytes()


def test_hf_converter_turns_megatron_layout_into_export_hfs_gpt2(
    golden, exported, tokens, hf_script, shared_data, monkeypatch, tmp_path
):
    """`--target-layout megatron` at TP=1 through Hugging Face's script gives the GPT-2 that
    export-hf writes (logits within 1e-5); without `checkpoint_version` its version-0 rule leaves
    the per-head QKV rows as they are and the model is silently another one. The script's `main`,
    `convert_megatron_checkpoint` and `fix_query_key_value_ordering` run unmodified: its config
    from `args` (the activation too), its renaming and QKV reordering, its saved files."""
    out = reshape(golden, tmp_path / "megatron", tp=1, pp=1, layout="megatron")
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "10"
    checkpoint = out / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt"
    state = torch_load(checkpoint)
    assert state["checkpoint_version"] == 3.0
    del state["checkpoint_version"]  # what mds wrote before: the silent bug of issue #23
    unversioned = tmp_path / "unversioned" / "model_optim_rng.pt"
    unversioned.parent.mkdir()
    torch.save(state, unversioned)

    converted = run_hf_script(hf_script, checkpoint, shared_data, monkeypatch)
    # The golden's exact GeLU (upstream ran --no-bias-gelu-fusion): args carry neither
    # bias_gelu_fusion nor openai_gelu, so the script picks "gelu", as export-hf says.
    for folder in (converted, exported):
        assert json.loads((folder / "config.json").read_text())["activation_function"] == "gelu"
    reference = transformers.GPT2LMHeadModel.from_pretrained(exported).eval()
    with torch.no_grad():
        expected = reference(tokens).logits[0]
    logits = hf_logits(converted, tokens)
    np.testing.assert_allclose(logits.numpy(), expected.numpy(), rtol=0, atol=1e-5)

    wrong = hf_logits(run_hf_script(hf_script, unversioned, shared_data, monkeypatch), tokens)
    assert (wrong - expected).abs().max() > 1e-2


# ---------------------------------------------------------------------------------------------
# (b) deepspeedai: DeepSpeed's loader, upstream's argument checks and QKV rule


def check_checkpoint_args(checkpoint_args, args) -> None:
    """deepspeedai's `check_checkpoint_args` for a run with a vocab file, not a universal
    checkpoint, no MoS/KD, at checkpoint_version 3.0: these fields must be equal."""
    for name, default in (
        ("num_layers", None),
        ("hidden_size", None),
        ("num_attention_heads", None),
        ("num_key_value_heads", None),
        ("add_position_embedding", True),
        ("max_position_embeddings", None),
        ("make_vocab_size_divisible_by", None),
        ("padded_vocab_size", None),
        ("tokenizer_type", None),
        ("tensor_model_parallel_size", None),
        ("pipeline_model_parallel_size", None),
    ):
        if default is None:
            value = getattr(checkpoint_args, name)
        else:
            value = getattr(checkpoint_args, name, default)
        assert value == getattr(args, name), name


def nested_shapes(tree) -> dict:
    if isinstance(tree, dict):
        return {key: nested_shapes(value) for key, value in tree.items()}
    return tuple(tree.shape)


def test_deepspeedai_plain_files_are_what_upstream_wrote(golden, tmp_path):
    """The golden reshaped to deepspeedai's layout at its own TP=2: each rank's `module` has the
    nesting and the very tensors upstream saved (version 3.0: upstream's load applies no QKV fix,
    `fix_query_key_value_ordering` acts below 2.0), `args` pass `check_checkpoint_args` against
    the run that wrote the golden and give `load_args_from_checkpoint` its values, and
    `universal_checkpoint_info` is upstream's own. DeepSpeed's `MegatronSDLoader` reads them."""
    out = reshape(golden, tmp_path / "ds", tp=2, pp=1, layout="deepspeedai")
    assert (out / "latest").read_text() == "global_step10"
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "10"
    files = [str(out / "global_step10" / f"mp_rank_{tp:02d}_model_states.pt") for tp in range(2)]
    loader = SDLoaderFactory.get_sd_loader(files, checkpoint_engine=None)
    for tp in range(2):
        upstream = torch_load(golden / "global_step10" / f"mp_rank_{tp:02d}_model_states.pt")
        _, ours, _ = loader.load(2, tp)
        assert nested_shapes(ours["module"]) == nested_shapes(upstream["module"])
        flat_ours = _flatten(ours["module"])
        for name, tensor in _flatten(upstream["module"]).items():
            assert torch.equal(flat_ours[name], tensor), name
        assert ours["checkpoint_version"] == upstream["checkpoint_version"] == 3.0
        assert ours["iteration"] == upstream["iteration"] and ours["tokens"] == upstream["tokens"]
        assert ours["universal_checkpoint_info"] == upstream["universal_checkpoint_info"]
        for key in ("global_steps", "global_samples", "skipped_steps", "mp_world_size"):
            assert ours[key] == upstream[key], key
        check_checkpoint_args(ours["args"], upstream["args"])
        for name in (  # load_args_from_checkpoint's fields, the progress and the activation
            "ffn_hidden_size seq_length kv_channels add_bias_linear swiglu "
            "untie_embeddings_and_output_weights apply_layernorm_1p use_rotary_position_embeddings "
            "rotary_percent virtual_pipeline_model_parallel_size consumed_train_samples "
            "consumed_valid_samples consumed_train_tokens iteration layernorm_epsilon"
        ).split():
            assert getattr(ours["args"], name) == getattr(upstream["args"], name), name
        assert isinstance(ours["args"], argparse.Namespace)


def _flatten(tree, prefix=""):
    if not isinstance(tree, dict):
        return {prefix[:-1]: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flatten(value, f"{prefix}{key}."))
    return out


def test_deepspeed_merges_deepspeedai_pipeline_files(golden, tmp_path):
    """TP=2 x PP=2 in deepspeedai's numbering (01 embedding, 02..N+1 layers, N+2 final norm),
    merged to one rank by DeepSpeed's `MegatronSDLoader` as `PipelineModule.load_state_dir` calls
    it (version 2.0: QKV shards concatenated, which keeps per-head rows): the whole tensors."""
    out = reshape(golden, tmp_path / "pipe", tp=2, pp=2, layout="deepspeedai")
    folder = out / "global_step10"
    whole = load_consolidated(golden).state_dict
    num_layers = 2
    names = {1: "embedding.", **{2 + i: f"layers.{i}." for i in range(num_layers)}}
    names[num_layers + 2] = "final_layernorm."
    found = sorted({int(p.name[6:8]) for p in folder.glob("layer_*")})
    assert found == sorted(names)
    for index, prefix in names.items():
        files = sorted(str(p) for p in folder.glob(f"layer_{index:02d}-*model_states.pt"))
        loader = SDLoaderFactory.get_sd_loader(files, version=2.0, checkpoint_engine=None)
        if prefix.startswith("layers."):  # DeepSpeed merges transformer layers only
            _, merged, _ = loader.load(1, 0, module_key=None, is_pipe_parallel=True)
        else:  # each rank as the engine loads it; Megatron's vocabulary ranges are contiguous
            ranks = [loader.load(2, tp, module_key=None, is_pipe_parallel=True)[1] for tp in (0, 1)]
            merged = dict(ranks[1])
            if prefix == "embedding.":
                merged["word_embeddings.weight"] = torch.cat(
                    [rank["word_embeddings.weight"] for rank in ranks]
                )
            for key in merged:
                if key != "word_embeddings.weight":
                    assert torch.equal(ranks[0][key], ranks[1][key]), key
        assert set(merged) == {n[len(prefix) :] for n in whole if n.startswith(prefix)}
        for key, tensor in merged.items():
            assert torch.equal(tensor, whole[prefix + key]), prefix + key
    mp_files = sorted(str(p) for p in folder.glob("mp_rank_*_model_states.pt"))
    assert len(mp_files) == 4  # one per (stage, TP rank); the engine's count check passes
    _, state, _ = SDLoaderFactory.get_sd_loader(mp_files, checkpoint_engine=None).load(
        4, 3, is_pipe_parallel=True
    )
    assert state["module"] is None and state["checkpoint_version"] == 3.0
    assert state["args"].pipeline_model_parallel_size == 2
    assert "pipeline_replicated_parameter_patterns" in state["universal_checkpoint_info"]


def test_bigscience_files_carry_its_checkpoint_info_and_enum(golden, tmp_path, megatron_modules):
    """bigscience's fork always runs GPTModelPipe: layer files (01, 03..N+2, N+4) even at PP=1;
    its `check_checkpoint_args` compares `position_embedding_type` with its own enum, and
    `_checkpoint_info` records both vocabulary sizes."""
    out = reshape(golden, tmp_path / "bs", tp=1, pp=1, layout="bigscience")
    folder = out / "global_step10"
    assert sorted(p.name[:8] for p in folder.glob("layer_*")) == [
        "layer_01",
        "layer_03",
        "layer_04",
        "layer_06",
    ]
    state = torch_load(folder / "mp_rank_00_model_states.pt")
    assert state["args"].position_embedding_type is megatron_modules.PositionEmbeddingType.absolute
    assert state["checkpoint_info"] == {"padded_vocab_size": 50432, "original_vocab_size": 50257}
    assert state["checkpoint_version"] == 3.0 and state["module"] is None
    assert not (
        out / "latest_checkpointed_iteration.txt"
    ).exists()  # its DeepSpeed path writes none


def test_megatron_layout_names_and_stage_local_layers(golden, tmp_path):
    """Megatron's `get_checkpoint_name` (`mp_rank_TT_PPP` with PP > 1) and `state_dict_for_save_
    checkpoint` per stage: the first stage the embedding and its layers from 0, the last its
    layers from 0, the final norm and `word_embeddings_for_head` (the embedding's TP shard)."""
    out = reshape(golden, tmp_path / "meg", tp=2, pp=2, layout="megatron")
    folder = out / "iter_0000010"
    for tp in range(2):
        first = torch_load(folder / f"mp_rank_{tp:02d}_000" / "model_optim_rng.pt")["model"]
        last = torch_load(folder / f"mp_rank_{tp:02d}_001" / "model_optim_rng.pt")["model"]
        assert set(first) == {"language_model"}
        assert set(first["language_model"]) == {"embedding", "encoder"}
        assert {k.split(".")[1] for k in first["language_model"]["encoder"]} == {"0"}
        assert set(last) == {"language_model", "word_embeddings_for_head"}
        assert set(last["language_model"]) == {"encoder"}
        encoder = last["language_model"]["encoder"]
        assert {k.split(".")[1] for k in encoder if k.startswith("layers.")} == {"0"}
        assert "final_layernorm.weight" in encoder
        assert torch.equal(
            last["word_embeddings_for_head"]["weight"],
            first["language_model"]["embedding"]["word_embeddings"]["weight"],
        )


def test_iteration_zero_is_a_megatron_release(golden, tmp_path):
    """Megatron's `read_metadata` refuses iteration 0 unless the tracker says `release`."""
    hf = tmp_path / "hf"
    merge("export-hf", "--load", golden, "--save", hf)
    imported = tmp_path / "imported"
    merge("import-hf", "--load", hf, "--save", imported)
    out = reshape(imported, tmp_path / "meg", tp=1, pp=1, layout="megatron")
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert (out / "release" / "mp_rank_00" / "model_optim_rng.pt").is_file()
    assert load_consolidated(out).meta.iteration == 0


# ---------------------------------------------------------------------------------------------
# (c) round trips


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("source_name", ["tp2", "pp2"])
@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 2)])
def test_every_layout_reads_back_bit_for_bit(
    golden, golden_pp2, tmp_path, layout, source_name, tp, pp
):
    source = golden if source_name == "tp2" else golden_pp2
    reference = load_consolidated(source)
    out = reshape(source, tmp_path / "out", tp=tp, pp=pp, layout=layout)
    copies = [out]
    if layout != "mds":  # also from upstream's keys alone, as mds reads upstream's own files
        bare = tmp_path / "bare"
        shutil.copytree(out, bare)
        for meta in bare.glob("*/meta.json"):
            meta.unlink()
        copies.append(bare)
    for path in copies:
        model = load_consolidated(path)
        assert model.config == reference.config
        assert list(model.state_dict) == list(reference.state_dict)
        for name, tensor in reference.state_dict.items():
            assert torch.equal(model.state_dict[name], tensor), name
        assert model.meta.iteration == 10
        assert (
            model.meta.progress.consumed_train_samples
            == reference.meta.progress.consumed_train_samples
        )


def test_target_layout_bad_values_are_one_line(golden, tmp_path, capsys):
    for extra, message in (
        (["--target-layout", "nemo"], "--target-layout nemo: choose one of mds, deepspeedai"),
        (["--target-layout", "megatron", "--with-optimizer"], "--with-optimizer writes"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main([str(a) for a in ["--load", golden, "--save", tmp_path / "out", *extra]])
        err = capsys.readouterr().err.splitlines()
        assert exit_info.value.code == 1 and len(err) == 1, err
        assert err[0].startswith(f"mds-merge-mp: error: {message}"), err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", ["mds", "deepspeedai"])
def test_universal_checkpoint_info_patterns_match_the_files_own_names(golden, tmp_path, layout):
    """DeepSpeed's ds_to_universal (deepspeed/checkpoint/ds_to_universal.py) classifies each
    parameter by `re.match` of these patterns against the names in the files; a pattern of
    another naming would silently treat a replicated or row-parallel parameter as column-split.
    Every name of the TP=2 plain-engine output is classified as mds_model.naming splits it."""
    from mds_checkpoint.engine_names import megatron_to_plain
    from mds_model.naming import split_of

    folder = reshape(golden, tmp_path / layout, tp=2, pp=1, layout=layout) / "global_step10"
    state = torch_load(folder / "mp_rank_00_model_states.pt")
    info = state["universal_checkpoint_info"]
    names = list(_flatten(state["module"]))
    assert len(names) == 28
    state_config = load_consolidated(folder).config

    def matches(kind: str, name: str) -> bool:
        return any(re.match(pattern, name) for pattern in info.get(kind, []))

    for name in names:
        split = split_of(megatron_to_plain(name), state_config)
        assert matches("vocabulary_parameter_patterns", name) == split.vocab, name
        assert matches("tp_replicated_parameter_patterns", name) == (split.dim is None), name
        assert matches("parameter_with_row_parallelism_patterns", name) == (split.dim == 1), name
