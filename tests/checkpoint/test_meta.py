"""meta.json as one typed record: every version written so far reads, the current one round-trips,
and a file that is not one (or is newer than this mds) is refused in one line."""

import json
from pathlib import Path

import pytest
from mds_checkpoint.meta import FORMAT, VERSION, CheckpointMeta, Parallel, Progress, read_meta
from mds_common.tokenizer_record import TokenizerRecord

WRITTEN = Path(__file__).resolve().parents[1] / "e2e" / "written_files"


def test_version_1_files_read_with_the_flags_names():
    """meta.json as bf19f14's mds-train and mds-merge-mp wrote it (tests/e2e/written_files)."""
    for folder in ("checkpoint/global_step4", "pipeline/global_step4", "megatron/iter_0000004"):
        meta = read_meta(WRITTEN / "bf19f14" / folder)
        assert meta.checkpoint_version == 1
        assert meta.parallel.tensor_model_parallel_size == 1
        assert meta.iteration == 4 and meta.progress.consumed_train_samples == 16
        assert meta.tokenizer.vocab_size == 384
    pipeline = read_meta(WRITTEN / "bf19f14/pipeline/global_step4")
    assert (pipeline.pipeline_model_parallel_size, pipeline.parallel.engine) == (2, "pipeline")
    merged = read_meta(WRITTEN / "bf19f14/megatron/iter_0000004")
    assert merged.layout == "megatron" and merged.reshaped["layout"] == "plain"


def test_the_current_version_round_trips(tmp_path):
    meta = CheckpointMeta(
        model={"num_layers": 2},
        parallel=Parallel(tensor_model_parallel_size=2, data_parallel_size=4, zero_stage=1),
        progress=Progress(iteration=7, lr_tokens=5),
        tokenizer=TokenizerRecord.of(type="GPT2BPETokenizer"),
        tag="global_step7",
    )
    content = meta.to_json()
    assert (content["format"], content["checkpoint_version"]) == (FORMAT, VERSION)
    assert content["parallel"]["tensor_model_parallel_size"] == 2
    assert "tensor_parallel" not in content["parallel"] and "optimizer" not in content
    assert content["lr_warmup_end_tokens"] is None  # recorded as none, not left out
    assert CheckpointMeta.from_json(json.loads(json.dumps(content)), where="x") == meta


@pytest.mark.parametrize(
    ("recorded", "rows"),
    [
        ({"tensor_model_parallel_size": 2, "padded_vocab_size": 50432}, 50432),
        ({"tensor_model_parallel_size": 2}, 50432),  # no derived size: the TP it was padded for
        ({"tensor_model_parallel_size": 1, "padded_vocab_size": 50304}, 50304),
        ({"padded_vocab_size": 50432, "pad_vocab_size_to": 50432}, 50432),  # as written now
    ],
)
def test_the_model_keeps_its_vocabulary_rows_whatever_tp_wrote_it(recorded, rows):
    """meta.json's `model` held the run's TP until GPTConfig stopped holding a parallel size: the
    rows it padded to stay the model's (a TP=2 GPT-2 has 50432), read as the config's own."""
    model = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 50257}
    config = CheckpointMeta(model={**model, **recorded}, parallel=Parallel()).config(where="x")
    assert config.padded_vocab_size == rows and not hasattr(config, "tensor_model_parallel_size")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"format": "other"}, "meta.json: not an mds-train checkpoint description"),
        ([], "meta.json: not an mds-train checkpoint description"),
        (
            {"format": FORMAT, "model": {}, "parallel": {}, "checkpoint_version": VERSION + 1},
            f"meta.json: checkpoint_version {VERSION + 1} is newer than this mds reads",
        ),
        (
            {"format": FORMAT, "model": {}, "parallel": {}, "checkpoint_version": "2"},
            "meta.json: checkpoint_version '2' is not one mds writes (1 to ",
        ),
    ],
)
def test_what_is_not_a_description_is_refused(tmp_path, content, message):
    (tmp_path / "meta.json").write_text(json.dumps(content))
    with pytest.raises(ValueError) as error:
        read_meta(tmp_path)
    assert str(error.value).startswith(f"{tmp_path / message}") and "\n" not in str(error.value)
    (tmp_path / "meta.json").write_text("{")
    with pytest.raises(ValueError, match=r"meta.json:1: not valid JSON"):
        read_meta(tmp_path)
