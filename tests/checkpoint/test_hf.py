"""Hugging Face: export-hf gives a GPT2LMHeadModel that transformers loads without missing or
unexpected keys and whose logits equal ours; import-hf then export-hf is bit-identical; GPT-2
weights made by transformers itself import at TP=2 x PP=2; rotary checkpoints are refused."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers  # a dev dependency (pyproject's dev group): the independent implementation
from mds_checkpoint import load_consolidated
from mds_checkpoint.verify import fixed_batch, logits_of
from safetensors.torch import load_file


def _load_hf(folder):
    model, info = transformers.GPT2LMHeadModel.from_pretrained(
        folder, output_loading_info=True, dtype=torch.float32
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set(), info
    assert info["mismatched_keys"] == set() and info["error_msgs"] == [], info
    return model.eval()


@pytest.fixture(scope="module")
def exported(merge_mp, tp2pp2_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "gpt2"
    result = merge_mp("export-hf", "--load", tp2pp2_checkpoint, "--save", out, "--verify")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "verify: largest logit difference 0"
    return out


def test_transformers_loads_the_export_and_computes_our_logits(tp2pp2_checkpoint, exported):
    names = sorted(p.name for p in exported.iterdir())
    assert names == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    recorded = load_consolidated(tp2pp2_checkpoint).meta["tokenizer"]  # the tokenizer, carried
    assert (exported / "vocab.json").read_bytes() == Path(recorded["vocab_file"]).read_bytes()
    config = json.loads((exported / "config.json").read_text())
    assert config["vocab_size"] == 5000 and config["n_layer"] == 4 and config["n_inner"] == 256
    weights = load_file(exported / "model.safetensors")
    assert weights["transformer.wte.weight"].shape == (5000, 64)  # padding rows removed
    assert "lm_head.weight" not in weights  # tied, as save_pretrained writes it
    ours = load_consolidated(tp2pp2_checkpoint)
    tokens = fixed_batch(ours)
    with torch.no_grad():
        theirs = _load_hf(exported)(tokens).logits
    torch.testing.assert_close(theirs, logits_of(ours, tokens), rtol=1e-5, atol=1e-5)


def test_import_then_export_is_bit_identical(merge_mp, exported, tmp_path):
    imported, again = tmp_path / "imported", tmp_path / "again"
    result = merge_mp(
        "import-hf", "--load", exported, "--save", imported,
        "--target-tensor-model-parallel-size", "2", "--target-pipeline-model-parallel-size", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((imported / "global_step0" / "meta.json").read_text())
    assert meta["parallel"]["tensor_parallel"] == 2 and meta["optimizer"] is None
    assert len(list((imported / "global_step0").glob("layer_*"))) == 12
    result = merge_mp("export-hf", "--load", imported, "--save", again)
    assert result.returncode == 0, result.stderr
    first, second = (
        load_file(exported / "model.safetensors"),
        load_file(again / "model.safetensors"),
    )
    assert list(first) == list(second)
    for name, tensor in first.items():
        assert second[name].dtype == tensor.dtype and torch.equal(second[name], tensor), name
    assert json.loads((again / "config.json").read_text()) == json.loads(
        (exported / "config.json").read_text()
    )
    for name in ("vocab.json", "merges.txt"):  # the folder's tokenizer goes round too
        assert (again / name).read_bytes() == (exported / name).read_bytes()


def test_gpt2_weights_from_transformers_import_at_tp2_pp2(merge_mp, tmp_path):
    config = transformers.GPT2Config(
        vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(tmp_path / "hf")
    out = tmp_path / "imported"
    result = merge_mp(
        "import-hf", "--load", tmp_path / "hf", "--save", out,
        "--target-tensor-model-parallel-size", "2", "--target-pipeline-model-parallel-size", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    model = load_consolidated(out)
    assert model.config.vocab_size == 1000 and model.config.padded_vocab_size == 1024
    tokens = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(tokens).logits
    torch.testing.assert_close(logits_of(model, tokens), expected, rtol=1e-5, atol=1e-5)


def test_rotary_is_refused_in_one_line(merge_mp, tp2pp2_checkpoint, tmp_path):
    source = tmp_path / "rotary"
    shutil.copytree(tp2pp2_checkpoint, source)
    meta_path = source / "global_step2" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["model"]["position_embedding_type"] = "rotary"
    meta_path.write_text(json.dumps(meta))
    result = merge_mp("export-hf", "--load", source, "--save", tmp_path / "hf")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"mds-merge-mp export-hf: error: {source / 'global_step2'}: position_embedding_type "
        "'rotary' has no GPT2LMHeadModel equivalent (GPT-2 has learned positions); not exported\n"
    )
    assert not (tmp_path / "hf").exists()
