"""A Llama-family checkpoint that upstream deepspeedai/Megatron-DeepSpeed (6acc370a) wrote, read,
reshaped and written back by mds.

The golden (`../shared/data/megatron-deepspeed-llama-golden/`, README there) is upstream's TP=2
plain-engine ZeRO-1 fp32 checkpoint of its Llama flag block (RMSNorm, SwiGLU, 4 query heads over
2 key/value heads, no linear biases, untied output layer, rotary), with the logits upstream's
own forward computed from it. Its query_key_value rows are grouped per key/value head on each
rank, its dense_h_to_4h rows [gate_r; up_r] per rank: a reshape that joins them as plain row
blocks would still load but give other logits, so the logits check the splits.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from mds_checkpoint import UniversalState, load_consolidated
from mds_checkpoint.describe import config_from_megatron_args
from mds_model import GPT

LOGIT_ROWS = [0, 1, 64, 127]
REAL_VOCAB = 1000
# Upstream's logits are ~0.1-1 (fp32); transformers' LlamaForCausalLM gives them within 4.8e-7
# (the golden's README), mds within the same: 1e-5 is the bound.
LOGIT_ATOL = 1e-5
GATE_UP = "language_model.encoder.layers.0.mlp.dense_h_to_4h.weight"


pytestmark = pytest.mark.usefixtures("megatron_enums")  # conftest.py


@pytest.fixture(scope="module")
def golden(shared_data) -> Path:
    return shared_data / "megatron-deepspeed-llama-golden"


@pytest.fixture(scope="module")
def golden_states(golden) -> list[dict]:
    folder = golden / "tp2-ckpt/global_step10"
    return [
        torch.load(folder / f"mp_rank_{tp:02d}_model_states.pt", weights_only=False)
        for tp in range(2)
    ]


def assert_golden_logits(path: Path, golden: Path) -> None:
    """Logits at the golden's rows within LOGIT_ATOL of upstream's, the same argmax at every
    position (mds_model's pure-torch path)."""
    model = load_consolidated(path)
    gpt = GPT(dataclasses.replace(model.config, use_fused_kernels=False))
    gpt.load_state_dict(model.state_dict)
    tokens = torch.from_numpy(np.load(golden / "logits/fixed_tokens.npy")[:128].astype(np.int64))
    with torch.no_grad():
        logits = gpt.eval().logits(tokens[None])[0][:, :REAL_VOCAB]
    expected = np.load(golden / "logits/logits_rows_0_1_64_127.npy")
    np.testing.assert_allclose(logits[LOGIT_ROWS].numpy(), expected, rtol=0, atol=LOGIT_ATOL)
    assert np.array_equal(logits.argmax(-1).numpy(), np.load(golden / "logits/argmax.npy"))


def test_upstream_llama_checkpoint_gives_upstream_logits(golden):
    model = load_consolidated(golden / "tp2-ckpt")
    config = model.config
    assert (config.normalization, config.activation, config.position_embedding_type) == (
        "rmsnorm",
        "swiglu",
        "rotary",
    )
    assert (config.num_query_groups, config.add_bias_linear) == (2, False)
    assert config.untie_embeddings_and_output_weights and config.ffn_size == 64
    assert (config.rotary_base, config.rotary_percent, config.vocab_size) == (1e4, 1.0, 1000)
    assert model.state_dict["output_layer.weight"].shape == (1024, 32)
    assert_golden_logits(golden / "tp2-ckpt", golden)


@pytest.fixture(scope="module")
def reshaped(merge_mp, golden, tmp_path_factory) -> dict[str, Path]:
    """The golden reshaped by mds-merge-mp: to TP=1 (--verify), to PP=2 with its optimizer state,
    and that PP=2 output back to upstream's TP=2 plain engine with the optimizer state."""
    out = tmp_path_factory.mktemp("llama")
    runs = {
        "tp1": [golden / "tp2-ckpt", "--target-tensor-model-parallel-size", "1", "--verify"],
        "pp2": [
            golden / "tp2-ckpt",
            *("--target-tensor-model-parallel-size", "1"),
            *("--target-pipeline-model-parallel-size", "2", "--with-optimizer"),
        ],
        "tp2": [out / "pp2", "--target-tensor-model-parallel-size", "2", "--with-optimizer"],
    }
    results = {}
    for name, (load, *flags) in runs.items():
        result = merge_mp("--load", load, "--save", out / name, *flags)
        assert result.returncode == 0, result.stderr
        results[name] = result
    line = results["tp1"].stdout.splitlines()[-1]
    assert line.startswith("verify: largest logit difference 0; "), line
    return {name: out / name / "global_step10" for name in runs}


def test_merge_mp_verifies_and_reshapes_the_llama_golden(reshaped, golden):
    for name in ("tp1", "pp2", "tp2"):
        assert_golden_logits(reshaped[name], golden)


def test_the_pipeline_files_are_upstream_s_gptmodelpipe(reshaped):
    """Embedding 1, layers 2-3, RMSNorm 4 (a weight only), LMHeadPipe 5 (`lm_head.weight`)."""
    folder = reshaped["pp2"]
    keys = {
        index: sorted(torch.load(folder / f"layer_{index:02d}-model_00-model_states.pt"))
        for index in range(1, 6)
    }
    assert keys[1] == ["word_embeddings.weight"]
    assert keys[4] == ["weight"] and keys[5] == ["lm_head.weight"]
    assert "mlp.dense_h_to_4h.weight" in keys[2] and not any("bias" in k for k in keys[2])


def test_a_tp_round_trip_gives_upstream_s_rank_files_back(reshaped, golden_states):
    """TP=2 -> PP=2 at TP=1 -> TP=2: every rank's tensors are upstream's to the bit (the grouped
    QKV and the [gate_r; up_r] halves cut where upstream's ranks hold them), and so are the
    universal_checkpoint_info patterns (SwiGLU's sub-parameters, the untied head) and the Llama
    args upstream's --load reads."""
    for tp, upstream in enumerate(golden_states):
        ours = torch.load(reshaped["tp2"] / f"mp_rank_{tp:02d}_model_states.pt", weights_only=False)
        flat_ours, flat_upstream = _flat(ours["module"]), _flat(upstream["module"])
        assert sorted(flat_ours) == sorted(flat_upstream)
        for name, tensor in flat_upstream.items():
            assert torch.equal(flat_ours[name], tensor), name
        assert ours["universal_checkpoint_info"] == upstream["universal_checkpoint_info"]
        for key in (
            "swiglu normalization num_key_value_heads add_bias_linear rope_theta rotary_percent "
            "untie_embeddings_and_output_weights use_rotary_position_embeddings "
            "add_position_embedding ffn_hidden_size kv_channels padded_vocab_size"
        ).split():
            value, expected = getattr(ours["args"], key), getattr(upstream["args"], key)
            assert (value, type(value)) == (expected, type(expected)), key  # rope_theta an int


def _flat(module: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for key, value in module.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def test_the_universal_checkpoint_round_trips_the_optimizer_state(reshaped, golden_states):
    """The PP=2 output's `zero/` (DeepSpeed's universal layout, folders named by the pipeline
    engine: the untied `1.word_embeddings.weight` and `5.lm_head.weight`) holds upstream's fp32
    masters (an fp32 run: the weights); dense_h_to_4h is declared as ds_to_universal declares
    upstream's SwiGLU (two sub-parameters on dim 0), and `shard` gives each TP=2 rank upstream's
    [gate_r; up_r]. Written again from it (TP=2), the state reads back the same."""
    zero = reshaped["pp2"] / "zero"
    assert {"1.word_embeddings.weight", "5.lm_head.weight", "4.weight"} <= {
        p.name for p in zero.iterdir()
    }
    record = torch.load(zero / "2.mlp.dense_h_to_4h.weight" / "fp32.pt", weights_only=False)
    assert (record["cat_dim"], record["param_n_sub_params"]) == (0, 2)
    assert torch.load(zero / "5.lm_head.weight" / "fp32.pt")["vocab_tensor"] is True
    state, again = UniversalState(reshaped["pp2"]), UniversalState(reshaped["tp2"])
    assert sorted(state.names()) == sorted(again.names()) and len(state.names()) == 15
    for tp, upstream in enumerate(golden_states):
        for plain, nested in (
            ("layers.0.mlp.dense_h_to_4h.weight", GATE_UP),
            ("layers.1.self_attention.query_key_value.weight", None),
            ("output_layer.weight", "language_model.output_layer.weight"),
        ):
            nested = nested or "language_model.encoder." + plain
            shard = state.shard(
                plain, tp_rank=tp, tensor_model_parallel_size=2, padded_vocab_size=1024
            )
            assert torch.equal(shard["fp32"], _flat(upstream["module"])[nested]), plain
    for name in state.names():
        for key, tensor in state.read(name).items():
            assert np.array_equal(tensor, again.read(name)[key]), (name, key)


def test_bigscience_glu_halves_are_read_up_first(golden, golden_states, tmp_path):
    """bigscience's --glu-activation swiglu computes `x1 * silu(x2)` of each rank's halves
    (megatron/model/glu_activations.py): [up_r; gate_r]. The golden with its halves swapped and
    its args saying so gives the same logits."""
    folder = tmp_path / "ckpt" / "global_step10"
    folder.mkdir(parents=True)
    for tp, state in enumerate(golden_states):
        module = _nested_copy(state["module"])
        for i in range(2):
            encoder = module["language_model"]["encoder"]
            gate, up = encoder[f"layers.{i}.mlp.dense_h_to_4h.weight"].chunk(2)
            encoder[f"layers.{i}.mlp.dense_h_to_4h.weight"] = torch.cat([up, gate])
        args = argparse.Namespace(**{**vars(state["args"]), "glu_activation": "swiglu"})
        del args.swiglu
        torch.save({**state, "module": module, "args": args}, folder / _rank_file(tp))
    assert_golden_logits(folder, golden)


def _nested_copy(module: dict) -> dict:
    return {k: _nested_copy(v) if isinstance(v, dict) else v for k, v in module.items()}


def _rank_file(tp: int) -> str:
    return f"mp_rank_{tp:02d}_model_states.pt"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"ds_sequence_parallel_fpdt": False},  # commit 676a482 on: [Q|K|V] blocks
            "2 key/value heads for 4 query heads with query_key_value rows ordered 3,np,hn",
        ),
        ({"glu_activation": "swiglu"}, "set both swiglu"),
        ({"glu_activation": "geglu"}, "glu_activation='geglu', an MLP mds GPTs do not compute"),
        ({"untie_embeddings_and_output_weights": False}, "untied output layer"),
    ],
)
def test_a_layout_that_cannot_be_told_is_refused_in_one_line(
    golden_states, tmp_path, change, message
):
    folder = tmp_path / "ckpt" / "global_step10"
    folder.mkdir(parents=True)
    for tp, state in enumerate(golden_states):
        args = argparse.Namespace(**{**vars(state["args"]), **change})
        torch.save({**state, "args": args}, folder / _rank_file(tp))
    with pytest.raises(ValueError, match=message) as error:
        load_consolidated(folder)
    assert "\n" not in str(error.value) and str(folder) in str(error.value)


def test_llama_args_read_back_what_they_wrote(golden_states):
    """upstream_state's args for a Llama config give the config back (mds_model.arguments' rows)."""
    from mds_checkpoint.upstream_state import megatron_args
    from mds_common.tokenizer_record import TokenizerRecord

    config = golden_config(golden_states)
    args = megatron_args(
        config,
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=1,
        progress={},
        tokenizer=TokenizerRecord(),
        layout="deepspeedai",
    )
    read = config_from_megatron_args(
        args, checkpoint_info={"original_vocab_size": 1000}, tensor_model_parallel_size=2, where="x"
    )
    assert read == config


def golden_config(golden_states):
    state = golden_states[0]
    return config_from_megatron_args(
        state["args"],
        checkpoint_info=state["universal_checkpoint_info"],
        tensor_model_parallel_size=2,
        where="golden",
    )


def test_plain_megatron_layout_keeps_the_untied_head_on_the_last_stage(merge_mp, golden, tmp_path):
    """--target-layout megatron at PP=2: the last stage's `language_model.output_layer` and no
    `word_embeddings_for_head` copy (that is the tied head's); read back from its args alone
    (meta.json removed), the golden's logits."""
    result = merge_mp(
        "--load", golden / "tp2-ckpt", "--save", tmp_path / "meg", "--target-layout", "megatron",
        "--target-tensor-model-parallel-size", "1", "--target-pipeline-model-parallel-size", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "meg" / "iter_0000010"
    (folder / "meta.json").unlink()
    first, last = (
        torch.load(folder / f"mp_rank_00_00{pp}" / "model_optim_rng.pt", weights_only=False)
        for pp in range(2)
    )
    assert set(last["model"]) == {"language_model"}
    assert set(last["model"]["language_model"]) == {"encoder", "output_layer"}
    assert "output_layer" not in first["model"]["language_model"]
    assert_golden_logits(folder, golden)


def test_a_llama_model_is_not_written_in_bigscience_s_layout(merge_mp, golden, tmp_path):
    result = merge_mp(
        "--load", golden / "tp2-ckpt", "--save", tmp_path / "bs", "--target-layout", "bigscience"
    )  # fmt: skip
    assert result.returncode == 1 and not (tmp_path / "bs").exists()
    assert result.stderr == (
        "mds-merge-mp: error: --target-layout bigscience: the model has normalization='rmsnorm', "
        "which bigscience's fork does not build ('layernorm' there); choose deepspeedai\n"
    )
