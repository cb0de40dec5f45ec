"""The model fields a checkpoint and the run loading it must agree on come from GPTConfig's marks:
older meta.json files (tests/e2e/written_files) lack the newer architecture fields and read as
GPT-2's values; a field that differs is one line naming it."""

import json
from pathlib import Path

import pytest
from mds_checkpoint.meta import CheckpointMeta, Parallel, model_fields
from mds_common.tokenizer_record import TokenizerRecord
from mds_model import GPTConfig
from mds_model.config import ARCHITECTURE, GPT2
from mds_train.checkpointing import FIELD_DEFAULTS, SHAPE_FIELDS, check_model_fields

WRITTEN = Path(__file__).parents[1] / "e2e/written_files"


def meta(model: dict) -> CheckpointMeta:
    return CheckpointMeta(model=model, parallel=Parallel(), tokenizer=TokenizerRecord())


def run_meta(**fields) -> CheckpointMeta:
    config = GPTConfig(
        num_layers=2, hidden_size=16, num_attention_heads=2, vocab_size=300, **fields
    )
    return meta(model_fields(config))


def test_the_compared_fields_are_the_architecture_fields():
    assert SHAPE_FIELDS == (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "ffn_size",
        "max_positions",
        "position_embedding_type",
        "rotary_percent",
        "embed_layernorm",
        "activation",
        "normalization",
        "num_query_groups",
        "add_bias_linear",
        "untie_embeddings_and_output_weights",
    )
    compared = set(SHAPE_FIELDS) | {"padded_vocab_size"}
    assert {f for f in GPTConfig.fields_of_kind(ARCHITECTURE) if f in compared} == compared - {
        "ffn_size",
        "max_positions",
        "padded_vocab_size",
    }


@pytest.mark.parametrize("path", sorted(WRITTEN.glob("*/*/*/meta.json")), ids=str)
def test_older_meta_json_files_match_the_run_that_wrote_them(path):
    """Written before the Llama-family fields existed: absent reads as GPT-2's value."""
    saved = json.loads(path.read_text())["model"]
    assert "normalization" not in saved  # what makes the test worth running
    config = GPTConfig(**{k: v for k, v in saved.items() if k in GPTConfig.__dataclass_fields__})
    check_model_fields(meta(saved), meta(model_fields(config)), SHAPE_FIELDS, path)


def test_a_field_absent_from_an_older_file_means_gpt2():
    older = {k: v for k, v in run_meta().model.items() if k not in FIELD_DEFAULTS}
    check_model_fields(meta(older), run_meta(), SHAPE_FIELDS, Path("ckpt"))
    with pytest.raises(ValueError) as error:
        check_model_fields(meta(older), run_meta(activation="gelu"), SHAPE_FIELDS, Path("ckpt"))
    assert str(error.value) == (
        "ckpt: activation is gelu_tanh in the checkpoint but gelu in this run; drop "
        "--no-bias-gelu-fusion and --onnx-safe, or add --openai-gelu (the flags of the run that "
        "wrote it)"
    )


@pytest.mark.parametrize(
    ("saved", "run", "fix"),
    [
        ({"normalization": "rmsnorm"}, {}, "give --normalization rmsnorm"),
        ({"activation": "swiglu"}, {}, "add --swiglu"),
        ({"add_bias_linear": False}, {}, "add --disable-bias-linear"),
        ({}, {"add_bias_linear": False}, "drop --disable-bias-linear"),
        ({"untie_embeddings_and_output_weights": True}, {},
         "add --untie-embeddings-and-output-weights"),
        ({"num_query_groups": 1}, {}, "give --num-key-value-heads 1"),
        ({}, {"num_query_groups": 1}, "drop --num-key-value-heads"),
        ({"rotary_percent": 0.25}, {}, "give --rotary-percent 0.25"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)  # fmt: skip
def test_another_architecture_in_the_checkpoint_is_one_line_naming_the_flag(saved, run, fix):
    """A Llama-family field that differs: its upstream flag, as the run that wrote it gave it."""
    [(name, theirs)] = saved.items() or [(next(iter(run)), GPT2[next(iter(run))])]
    ours = run.get(name, GPT2[name])
    checkpoint = {**run_meta().model, **saved}
    with pytest.raises(ValueError) as error:
        check_model_fields(meta(checkpoint), run_meta(**run), SHAPE_FIELDS, Path("ckpt"))
    assert str(error.value) == (
        f"ckpt: {name} is {theirs} in the checkpoint but {ours} in this run; {fix} (the flags "
        "of the run that wrote it)"
    )
