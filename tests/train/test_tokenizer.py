"""mds-train reads the vocabulary size and EOD of any tokenizer through mds_tokenize's interface
(GPT-2 files or a Hugging Face tokenizer.json, the same flags as mds-tokenize), records it in
meta.json, and refuses a dataset whose sidecar names another tokenizer in one line."""

import json
from pathlib import Path

import pytest
import typer
from mds_common.argv import normalise, option_specs
from mds_tokenize.config import TokenizeConfig
from mds_tokenize.pipeline import run as tokenize
from mds_train.cli import build_config, make_app
from mds_train.config import Topology
from mds_train.data import read_vocabulary
from mds_train.run import _check_datasets, run_description

MODEL = "--num-layers 2 --hidden-size 8 --num-attention-heads 2 --seq-length 8 --lr 1".split()
MODEL += "--micro-batch-size 1 --train-iters 1".split()
WORDS = ["<unk>", "hello", "world", "again", "</s>"]


def config_of(*flags):
    command = typer.main.get_command(make_app())
    args = normalise([*MODEL, *map(str, flags)], option_specs(command)).args
    with command.make_context("mds-train", args) as ctx:
        return build_config(dict(ctx.params))


@pytest.fixture
def word_tokenizer(tmp_path) -> Path:
    """A five-word tokenizer.json whose end-of-text token is `</s>` (id 4)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "words"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_vocabulary_of_gpt2_files(shared_data):
    gpt2 = ("--vocab-file", shared_data / "gpt2-vocab.json")
    config = config_of("--data-path", "D", *gpt2, "--merge-file", shared_data / "gpt2-merges.txt")
    vocab = read_vocabulary(config.data)
    assert (vocab.size, vocab.eod_id) == (50257, 50256)
    assert vocab.record.type == "GPT2BPETokenizer"
    assert vocab.record.vocab_file == str((shared_data / "gpt2-vocab.json").resolve())
    with pytest.raises(ValueError, match="^Missing option '--merge-file': "):
        read_vocabulary(config_of("--data-path", "D", *gpt2).data)


def test_vocabulary_of_a_tokenizer_json_goes_into_meta_json(word_tokenizer):
    config = config_of(
        *("--data-path", "D", "--tokenizer-type", "PretrainedFromHF"),
        *("--tokenizer-name-or-path", word_tokenizer),
    )
    vocab = read_vocabulary(config.data)
    assert (vocab.size, vocab.eod_id) == (5, 4)
    topology = Topology(world_size=1, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    gpt = config.model.gpt_config(
        vocab_size=vocab.size, tensor_model_parallel_size=1, params_dtype=config.params_dtype
    )
    meta = run_description(config, topology, gpt, vocab).to_json()["tokenizer"]
    assert meta["type"] == "PretrainedFromHF" and meta["eod_token"] == "</s>"
    assert meta["tokenizer_file"] == str((word_tokenizer / "tokenizer.json").resolve())
    assert (meta["vocab_size"], meta["eod_id"]) == (5, 4)
    # --eod-token names another one.
    with_flag = config_of(
        *("--data-path", "D", "--tokenizer-type", "PretrainedFromHF"),
        *("--tokenizer-name-or-path", word_tokenizer, "--eod-token", "again"),
    )
    assert read_vocabulary(with_flag.data).eod_id == 3


def test_dataset_of_another_tokenizer_is_refused(shared_data, tmp_path, word_tokenizer):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "hello world again"}) + "\n")
    tokenize(
        TokenizeConfig(
            input=corpus,
            output_prefix=str(tmp_path / "words"),
            tokenizer_type="PretrainedFromHF",
            tokenizer_name_or_path=str(word_tokenizer),
            append_eod=True,
        )
    )
    dataset = str(tmp_path / "words_text_document")
    same = config_of(
        *("--data-path", dataset, "--tokenizer-type", "PretrainedFromHF"),
        *("--tokenizer-name-or-path", word_tokenizer / "tokenizer.json"),
    )
    _check_datasets(same, read_vocabulary(same.data))  # the file itself: the same tokenizer
    other = config_of(
        *("--data-path", dataset, "--vocab-file", shared_data / "gpt2-vocab.json"),
        *("--merge-file", shared_data / "gpt2-merges.txt"),
    )
    with pytest.raises(ValueError) as error:
        _check_datasets(other, read_vocabulary(other.data))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"{dataset} was tokenized with PretrainedFromHF "
        f"{(word_tokenizer / 'tokenizer.json').resolve()}, but the tokenizer flags name "
    )


def test_a_missing_tokenizer_flag_is_a_usage_error(capsys, shared_data):
    """Exit 2 and one line, before any training starts, as in mds-tokenize and mds-generate."""
    from mds_train.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*MODEL, "--data-path", "D", "--vocab-file", str(shared_data / "gpt2-vocab.json")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("mds-train: error: Missing option '--merge-file': "), err
