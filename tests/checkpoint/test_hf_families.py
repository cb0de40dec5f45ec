"""Hugging Face both ways for the families past GPT-2: LlamaForCausalLM (grouped-query attention,
untied head; tied with biases), GPTNeoXForCausalLM (partial rotary, sequential residuals) and
BloomForCausalLM (ALiBi, embedding LayerNorm). A transformers model of each, random but far from
its init, imported by import-hf at TP=2 x PP=2 gives transformers' logits (1e-5), and export-hf
of that checkpoint loads in transformers with no missing or unexpected keys and the same logits;
an mds model exported by the adapter does too; upstream's Llama golden exported gives upstream's
logits; layouts no family holds are refused in one line."""

import json

import numpy as np
import pytest
import torch
import transformers
from mds_checkpoint import load_consolidated
from mds_checkpoint.verify import logits_of
from mds_model import GPT, GPTConfig
from mds_model.hf_families import hf_adapter, hf_problem
from safetensors.torch import save_file

from ..hf_models import HF_ARCHITECTURES, tiny_hf_models

VOCAB, SEQ = 120, 16
TOL = 1e-5


def _far_from_init(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Norms at one and biases at zero would hide swapped or mis-cut weights."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    return model.eval()


HF_MODELS = tiny_hf_models(
    max_position_embeddings=32, vocab_size=VOCAB, attn_implementation="eager"
)


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(seed))


def _load_hf(folder) -> torch.nn.Module:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, output_loading_info=True, dtype=torch.float32, attn_implementation="eager"
    )
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set(), info
    assert info["mismatched_keys"] == set() and info["error_msgs"] == [], info
    return model.eval()


def _largest(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("family", list(HF_MODELS))
def test_transformers_model_imports_at_tp2_pp2_and_exports_back(merge_mp, tmp_path, family):
    torch.manual_seed(0)
    reference = _far_from_init(HF_MODELS[family](), seed=1)
    reference.save_pretrained(tmp_path / "hf")
    tokens = _tokens(2)
    with torch.no_grad():
        expected = reference(tokens).logits
    result = merge_mp(
        "import-hf", "--load", tmp_path / "hf", "--save", tmp_path / "mds",
        "--target-tensor-model-parallel-size", "2", "--target-pipeline-model-parallel-size", "2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    model = load_consolidated(tmp_path / "mds")
    meta = json.loads((tmp_path / "mds/global_step0/meta.json").read_text())
    assert meta["parallel"]["tensor_model_parallel_size"] == 2
    assert model.config.vocab_size == VOCAB
    assert _largest(logits_of(model, tokens), expected) < TOL

    result = merge_mp("export-hf", "--load", tmp_path / "mds", "--save", tmp_path / "back")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"wrote {tmp_path / 'back'}: {HF_ARCHITECTURES[family]}, ")
    back = _load_hf(tmp_path / "back")
    assert type(back) is type(reference)
    with torch.no_grad():
        assert _largest(back(tokens).logits, expected) < TOL


def test_llama_imports_at_tp1_pp1(merge_mp, tmp_path):
    reference = _far_from_init(HF_MODELS["llama"](), seed=3)
    reference.save_pretrained(tmp_path / "hf")
    result = merge_mp("import-hf", "--load", tmp_path / "hf", "--save", tmp_path / "mds")
    assert result.returncode == 0, result.stderr
    model = load_consolidated(tmp_path / "mds")
    assert model.config.query_groups == 2 and model.config.untie_embeddings_and_output_weights
    assert model.config.rotary_base == 500000.0
    tokens = _tokens(4)
    with torch.no_grad():
        assert _largest(logits_of(model, tokens), reference(tokens).logits) < TOL


_SMALL = dict(
    num_layers=2, hidden_size=64, num_attention_heads=8, vocab_size=VOCAB, seq_length=SEQ,
    hidden_dropout=0.0, attention_dropout=0.0, use_fused_kernels=False,
)  # fmt: skip
MDS_CONFIGS = {
    "llama-gqa": ("llama", dict(num_query_groups=2, ffn_hidden_size=96, rotary_base=500000.0)),
    "llama-tied-biases": (
        "llama",
        dict(add_bias_linear=True, untie_embeddings_and_output_weights=False),
    ),
    "gpt-neox": (
        "gpt2",
        dict(
            position_embedding_type="rotary",
            rotary_percent=0.25,
            activation="gelu",
            untie_embeddings_and_output_weights=True,
        ),
    ),
    "bloom": ("bloom", {}),
    "bloom-untied": ("bloom", dict(untie_embeddings_and_output_weights=True)),
}


@pytest.mark.parametrize("name", list(MDS_CONFIGS))
def test_an_mds_model_exported_loads_in_transformers_with_our_logits(tmp_path, name):
    preset, fields = MDS_CONFIGS[name]
    config = GPTConfig.preset(preset, **_SMALL, **fields)
    ours = _far_from_init(GPT(config, init_seed=5), seed=6)
    adapter = hf_adapter(config)
    (tmp_path / "config.json").write_text(json.dumps(adapter.hf_config(config)))
    save_file(adapter.to_hf(ours.state_dict(), config), tmp_path / "model.safetensors")
    theirs = _load_hf(tmp_path)
    tokens = _tokens(7)
    with torch.no_grad():
        assert _largest(theirs(tokens).logits, ours.logits(tokens)[..., :VOCAB]) < TOL
    # and back: the adapter's inverse gives our weights exactly (padding rows zero)
    back = adapter.from_hf(theirs.state_dict(), config)
    for key, tensor in ours.state_dict().items():
        rows = VOCAB if key in ("embedding.word_embeddings.weight", "output_layer.weight") else None
        assert torch.equal(back[key][:rows], tensor[:rows]), key


def test_upstream_llama_golden_exported_gives_upstream_logits(merge_mp, shared_data, tmp_path):
    golden = shared_data / "megatron-deepspeed-llama-golden"
    vocab = golden / "vocab"
    result = merge_mp(
        "export-hf", "--load", golden / "tp2-ckpt", "--save", tmp_path / "hf",
        "--vocab-file", vocab / "vocab.json", "--merge-file", vocab / "merges.txt",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "hf/config.json").read_text())
    assert config["num_key_value_heads"] == 2 and config["tie_word_embeddings"] is False
    eod = json.loads((vocab / "vocab.json").read_text())["<|endoftext|>"]
    assert config["eos_token_id"] == eod < 1000  # the golden's tokenizer's, not GPT-2's 50256
    assert (tmp_path / "hf/vocab.json").read_bytes() == (vocab / "vocab.json").read_bytes()
    theirs = _load_hf(tmp_path / "hf")
    assert isinstance(theirs, transformers.LlamaForCausalLM)
    tokens = torch.from_numpy(np.load(golden / "logits/fixed_tokens.npy")[:128].astype(np.int64))
    with torch.no_grad():
        logits = theirs(tokens[None]).logits[0]
    expected = np.load(golden / "logits/logits_rows_0_1_64_127.npy")
    np.testing.assert_allclose(logits[[0, 1, 64, 127]].numpy(), expected, rtol=0, atol=TOL)
    assert np.array_equal(logits.argmax(-1).numpy(), np.load(golden / "logits/argmax.npy"))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(position_embedding_type="rotary", rotary_percent=0.5, activation="swiglu",
                 normalization="rmsnorm", add_bias_linear=False,
                 untie_embeddings_and_output_weights=True),
            "rotary_percent 0.5 has no LlamaForCausalLM equivalent (LlamaConfig rotates whole "
            "heads)",
        ),
        (
            dict(position_embedding_type="rotary", num_query_groups=2,
                 untie_embeddings_and_output_weights=True),
            "num_query_groups 2 has no GPTNeoXForCausalLM equivalent (GPT-NeoX has a key/value "
            "head per query head)",
        ),
        (
            dict(position_embedding_type="alibi", embed_layernorm=True, ffn_hidden_size=96),
            "ffn_hidden_size 96 has no BloomForCausalLM equivalent (BLOOM's is 4 x hidden_size, "
            "256)",
        ),
    ],
)  # fmt: skip
def test_a_layout_no_family_holds_is_refused_by_the_closest(fields, message):
    config = GPTConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, vocab_size=VOCAB, **fields
    )
    assert hf_problem(config) == message
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        hf_adapter(config)


def test_parallel_residual_gpt_neox_is_refused_in_one_line(merge_mp, tmp_path):
    model = transformers.GPTNeoXForCausalLM(
        transformers.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_attention_heads=8,
            num_hidden_layers=1,
            intermediate_size=128,
        )
    )
    model.save_pretrained(tmp_path / "hf")
    result = merge_mp("import-hf", "--load", tmp_path / "hf", "--save", tmp_path / "out")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"mds-merge-mp import-hf: error: {tmp_path / 'hf/config.json'}: use_parallel_residual is "
        "true (GPT-NeoX's default), which mds GPTs do not implement (their residuals are "
        "sequential)\n"
    )
    assert not (tmp_path / "out").exists()


# Other names files give the tensors: bigscience's BLOOM without `transformer.`; GPT-NeoX's head
# as transformers 5's module calls it (save_pretrained writes `embed_out`, as 4 named it).
_OLD_NAMES = {
    "bloom": lambda name: name.removeprefix("transformer."),
    "gpt-neox": lambda name: {"embed_out.weight": "lm_head.weight"}.get(name, name),
}


@pytest.mark.parametrize("family", list(_OLD_NAMES))
def test_other_tensor_names_import(merge_mp, tmp_path, family):
    from safetensors.torch import load_file

    reference = _far_from_init(HF_MODELS[family](), seed=8)
    reference.save_pretrained(tmp_path / "hf")
    weights = load_file(tmp_path / "hf/model.safetensors")
    renamed = {_OLD_NAMES[family](name): tensor for name, tensor in weights.items()}
    assert set(renamed) != set(weights)
    save_file(renamed, tmp_path / "hf/model.safetensors", metadata={"format": "pt"})
    result = merge_mp("import-hf", "--load", tmp_path / "hf", "--save", tmp_path / "mds")
    assert result.returncode == 0, result.stderr
    tokens = _tokens(9)
    with torch.no_grad():
        expected = reference(tokens).logits
    assert _largest(logits_of(load_consolidated(tmp_path / "mds"), tokens), expected) < TOL


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
         "model_type is 'mistral'; mds reads Hugging Face folders of 'gpt2', 'llama', "
         "'gpt_neox', 'bloom'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0}},
         "rope_type 'llama3': mds GPTs implement the default rotary only"),
        ({"attention_bias": True},
         "attention_bias True with mlp_bias False: mds GPTs have one switch for every linear's "
         "bias (add_bias_linear)"),
    ],
)  # fmt: skip
def test_a_llama_folder_mds_cannot_read_is_refused_in_one_line(merge_mp, tmp_path, change, message):
    HF_MODELS["llama"]().save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf/config.json").read_text())
    (tmp_path / "hf/config.json").write_text(json.dumps({**config, **change}))
    result = merge_mp("import-hf", "--load", tmp_path / "hf", "--save", tmp_path / "out")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (
        f"mds-merge-mp import-hf: error: {tmp_path / 'hf/config.json'}: {message}\n"
    )
    assert not (tmp_path / "out").exists()
