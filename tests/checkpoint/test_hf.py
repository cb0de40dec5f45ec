"""Hugging Face: export-hf gives a GPT2LMHeadModel that transformers loads without missing or
unexpected keys and whose logits equal ours; import-hf then export-hf is bit-identical; GPT-2
weights made by transformers itself import at TP=2 x PP=2 with either GeLU and export back;
rotary checkpoints and activations other than a GeLU are refused."""

import json
import os
import shutil
import stat
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
    # The export drops the padding rows Megatron trains (Hugging Face's vocabulary is the
    # tokenizer's), so the same logits of the real vocabulary give another loss.
    verified = result.stdout.splitlines()[-1]
    assert verified.startswith(
        "verify: largest logit difference 0; loss on 2 x 32 random token ids (not text) "
    )
    assert "(the source's " in verified and not verified.endswith("too)")
    return out


def test_transformers_loads_the_export_and_computes_our_logits(tp2pp2_checkpoint, exported):
    names = sorted(p.name for p in exported.iterdir())
    assert names == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
    recorded = load_consolidated(tp2pp2_checkpoint).meta.tokenizer  # the tokenizer, carried
    assert (exported / "vocab.json").read_bytes() == Path(recorded.vocab_file).read_bytes()
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
    assert meta["parallel"]["tensor_model_parallel_size"] == 2 and meta["optimizer"] is None
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


def _gpt2(activation_function: str) -> transformers.GPT2LMHeadModel:
    """A transformers GPT-2 whose weights are large enough (std 0.1, not its 0.02 init) that the
    MLP's inputs reach where the two GeLUs differ."""
    config = transformers.GPT2Config(
        vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, activation_function=activation_function,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.1)
    return model


# transformers' names -> the GeLU mds reads them as (gelu_fast and gelu_pytorch_tanh compute the
# tanh formula of gelu_new; gelu is torch's exact F.gelu), and what export-hf writes back.
_HF_NAMES = {"gelu_new": "gelu_new", "gelu_fast": "gelu_new", "gelu_pytorch_tanh": "gelu_new"}


@pytest.mark.parametrize(
    "activation_function", ["gelu_new", "gelu", "gelu_fast", "gelu_pytorch_tanh"]
)
def test_gpt2_weights_from_transformers_import_at_tp2_pp2(merge_mp, tmp_path, activation_function):
    reference = _gpt2(activation_function)
    reference.save_pretrained(tmp_path / "hf")
    out = tmp_path / "imported"
    result = merge_mp(
        "import-hf", "--load", tmp_path / "hf", "--save", out,
        "--target-tensor-model-parallel-size", "2", "--target-pipeline-model-parallel-size", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    model = load_consolidated(out)
    assert model.config.vocab_size == 1000 and model.config.padded_vocab_size == 1024
    assert model.config.activation == ("gelu" if activation_function == "gelu" else "gelu_tanh")
    tokens = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(tokens).logits
    torch.testing.assert_close(logits_of(model, tokens), expected, rtol=1e-5, atol=1e-5)
    # The tolerance sees the GeLU: the other one's logits are far outside it.
    other = _gpt2("gelu_new" if activation_function == "gelu" else "gelu")
    other.load_state_dict(reference.state_dict())
    with torch.no_grad():
        assert (other(tokens).logits - expected).abs().max() > 1e-3
    # ...and export-hf writes it back as transformers' name of the same function.
    result = merge_mp("export-hf", "--load", out, "--save", tmp_path / "back")
    assert result.returncode == 0, result.stderr
    back = _load_hf(tmp_path / "back")
    assert back.config.activation_function == _HF_NAMES.get(activation_function, "gelu")
    with torch.no_grad():
        torch.testing.assert_close(back(tokens).logits, expected, rtol=1e-5, atol=1e-5)


def test_an_activation_other_than_a_gelu_is_refused_in_one_line(merge_mp, tmp_path):
    _gpt2("gelu").save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf/config.json").read_text())
    (tmp_path / "hf/config.json").write_text(json.dumps({**config, "activation_function": "relu"}))
    result = merge_mp("import-hf", "--load", tmp_path / "hf", "--save", tmp_path / "out")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"mds-merge-mp import-hf: error: {tmp_path / 'hf/config.json'}: activation_function "
        "'relu': mds GPTs compute a GeLU, one of gelu_new, gelu_pytorch_tanh, gelu_fast, "
        "gelu_accurate, gelu, gelu_python\n"
    )
    assert not (tmp_path / "out").exists()


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
        "'rotary' has no GPT2LMHeadModel equivalent (GPT-2's is 'learned'); not exported\n"
    )
    assert not (tmp_path / "hf").exists()


def test_every_exported_file_has_the_mode_open_gives(merge_mp, tp2pp2_checkpoint, tmp_path):
    """safetensors writes model.safetensors through a private temporary file (mode 0600) that
    it renames; the export's files all get what a file opened normally gets (0666 less the
    umask), whatever the umask is."""
    previous = os.umask(0o002)
    try:
        result = merge_mp("export-hf", "--load", tp2pp2_checkpoint, "--save", tmp_path / "hf")
        with open(tmp_path / "probe", "w"):
            pass
    finally:
        os.umask(previous)
    assert result.returncode == 0, result.stderr
    expected = stat.S_IMODE((tmp_path / "probe").stat().st_mode)
    assert expected == 0o664
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
    assert modes == dict.fromkeys(
        ["config.json", "merges.txt", "model.safetensors", "vocab.json"], expected
    )


def test_a_hugging_face_folder_without_config_json_is_named_so(merge_mp, tmp_path):
    """import-hf, merge and export-hf given a save_pretrained folder that lost its config.json:
    the line says what the Hugging Face folder lacks, not that it has no `latest`."""
    folder = tmp_path / "hf"
    _gpt2("gelu_new").save_pretrained(folder)
    (folder / "config.json").unlink()
    expected = (
        f"{folder}: a Hugging Face folder needs config.json beside model.safetensors; copy the "
        "model's config.json there (save_pretrained writes both)\n"
    )
    for command in (["import-hf"], [], ["export-hf"]):
        result = merge_mp(*command, "--load", folder, "--save", tmp_path / "out")
        assert result.returncode == 1 and result.stdout == "", result.stderr
        prog = " ".join(["mds-merge-mp", *command])
        assert result.stderr == f"{prog}: error: {expected}"
        assert not (tmp_path / "out").exists()


def test_a_whole_hugging_face_folder_given_as_a_checkpoint_points_to_import_hf(merge_mp, tmp_path):
    """merge and export-hf read training checkpoints; a Hugging Face model folder given to them
    is named as such, with the command that converts it (it was "not a checkpoint (no latest
    ...)")."""
    folder = tmp_path / "hf"
    _gpt2("gelu_new").save_pretrained(folder)
    for command in ([], ["export-hf"]):
        result = merge_mp(*command, "--load", folder, "--save", tmp_path / "out")
        assert result.returncode == 1, result.stderr
        assert result.stderr == (
            f"{' '.join(['mds-merge-mp', *command])}: error: {folder}: a Hugging Face model "
            f"folder, not a training checkpoint; convert it with mds-merge-mp import-hf --load "
            f"{folder} --save DIR (mds-generate reads it as it is)\n"
        )
        assert not (tmp_path / "out").exists()
