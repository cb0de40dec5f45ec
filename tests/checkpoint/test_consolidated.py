"""`load_consolidated`: any checkpoint as one TP=1 model that `mds_model.GPT` loads."""

import pytest
import torch
from mds_checkpoint import load_consolidated
from mds_checkpoint.engine_names import megatron_to_plain
from mds_model import GPT


def _layer_file(folder, index, tp):
    return torch.load(folder / f"layer_{index:02d}-model_{tp:02d}-model_states.pt")


def test_tp2pp2_consolidates_to_the_joined_shards(tp2pp2_checkpoint):
    model = load_consolidated(tp2pp2_checkpoint)
    assert model.config.num_layers == 4
    assert model.meta.iteration == 2 and model.meta.tensor_model_parallel_size == 2
    gpt = GPT(model.config)
    gpt.load_state_dict(model.state_dict)  # strict: every name, every shape
    folder = tp2pp2_checkpoint / "global_step2"
    # Written out by hand: layer 2 is pipeline index 4 (deepspeedai's numbering); QKV rows on
    # dim 0, dense on dim 1.
    shards = [_layer_file(folder, 4, tp) for tp in range(2)]
    qkv = torch.cat([s["self_attention.query_key_value.weight"] for s in shards])
    dense = torch.cat([s["mlp.dense_4h_to_h.weight"] for s in shards], dim=1)
    assert torch.equal(model.state_dict["layers.2.self_attention.query_key_value.weight"], qkv)
    assert torch.equal(model.state_dict["layers.2.mlp.dense_4h_to_h.weight"], dense)
    assert torch.equal(
        model.state_dict["layers.2.input_layernorm.weight"], shards[1]["input_layernorm.weight"]
    )
    words = torch.cat([_layer_file(folder, 1, tp)["word_embeddings.weight"] for tp in range(2)])
    assert torch.equal(model.state_dict["embedding.word_embeddings.weight"], words)
    tokens = torch.randint(0, model.config.vocab_size, (2, 16))
    assert torch.isfinite(gpt.logits(tokens)).all()


def test_same_result_from_the_tag_folder_and_by_iteration(tp2pp2_checkpoint):
    by_latest = load_consolidated(tp2pp2_checkpoint)
    by_folder = load_consolidated(tp2pp2_checkpoint / "global_step2")
    by_iteration = load_consolidated(tp2pp2_checkpoint, iteration=2)
    for other in (by_folder, by_iteration):
        assert other.config == by_latest.config
        assert all(torch.equal(other.state_dict[k], v) for k, v in by_latest.state_dict.items())


def test_not_a_checkpoint_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="not a checkpoint"):
        load_consolidated(tmp_path)
    with pytest.raises(ValueError, match="no checkpoint of iteration 7"):
        load_consolidated(tmp_path, iteration=7)


def test_zero3_partitions_consolidate_as_deepspeed_s_zero_to_fp32(zero3_checkpoint):
    """ZeRO-3 keeps the weights only as fp32 partitions; DeepSpeed's own zero_to_fp32 is the
    reference for putting them back together."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    model = load_consolidated(zero3_checkpoint)
    assert model.meta.parallel.zero_stage == 3 and model.meta.parallel.data_parallel_size == 2
    reference = get_fp32_state_dict_from_zero_checkpoint(str(zero3_checkpoint))
    # DeepSpeed names them as mds-train's engine module does: Megatron's nesting.
    reference = {megatron_to_plain(name): tensor for name, tensor in reference.items()}
    assert sorted(reference) == sorted(model.state_dict)
    for name, tensor in reference.items():
        assert torch.equal(model.state_dict[name], tensor), name
    GPT(model.config).load_state_dict(model.state_dict)


def test_zero3_files_without_meta_json_read_as_upstream_s(zero3_checkpoint, tmp_path):
    """Upstream's ZeRO-3 checkpoints have no mp_rank files and no meta.json: DeepSpeed writes the
    client state (upstream's args, iteration, checkpoint_version) into each
    zero_pp_rank_D_mp_rank_TT_model_states.pt. mds-train's ZeRO-3 files carry the same keys, so
    without their meta.json they are such a folder; it reads from its own files to the same model
    (by hand, upstream's own TP=2 ZeRO-3 checkpoint read so and resumed: see the README)."""
    import shutil

    copy = tmp_path / "upstream-like"
    shutil.copytree(zero3_checkpoint, copy)
    tag = (copy / "latest").read_text().strip()
    (copy / tag / "meta.json").unlink()
    assert not list((copy / tag).glob("mp_rank_*"))
    expected, model = load_consolidated(zero3_checkpoint), load_consolidated(copy)
    # Megatron's args spell the defaults out (ffn_hidden_size, max_position_embeddings).
    for field in ("num_layers", "hidden_size", "ffn_size", "max_positions", "padded_vocab_size"):
        assert getattr(model.config, field) == getattr(expected.config, field), field
    assert (model.meta.parallel.zero_stage, model.meta.parallel.data_parallel_size) == (3, 2)
    assert model.meta.iteration == expected.meta.iteration
    assert sorted(model.state_dict) == sorted(expected.state_dict)
    for name, tensor in expected.state_dict.items():
        assert torch.equal(model.state_dict[name], tensor), name
