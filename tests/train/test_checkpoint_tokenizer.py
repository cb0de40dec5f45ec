"""mds-train runs mds_tokenize's one tokenizer check on every load: a checkpoint whose meta.json
records another tokenizer than the flags name (same size with two ids swapped, or a smaller
vocabulary) is refused in one line naming both, through --load and --universal-checkpoint alike,
before any training; --allow-tokenizer-change lets a tokenizer whose ids fit the rows through,
and meta.json then records it. Before, all of these trained and recorded the new tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY = "megatron-golden/gpt2-tiny-{}"
ERROR = "mds-train: error: "


def _train(runs, flags):
    return runs.train([str(flag) for flag in flags])


def _flags(runs, shared_data, data_cache, out: Path, vocab: Path, *extra) -> list[str]:
    flags = runs.checkpoint_test_flags(shared_data, data_cache, out, *extra)
    flags[flags.index("--vocab-file") + 1] = str(vocab)
    return flags


@pytest.fixture(scope="module")
def trained(runs, shared_data, data_cache, tmp_path_factory) -> Path:
    """Two iterations on the tiny GPT-2 vocabulary, saved at 2: the save folder."""
    out = tmp_path_factory.mktemp("tokenizer-source")
    vocab = shared_data / TINY.format("vocab.json")
    flags = _flags(runs, shared_data, data_cache, out, vocab, "--train-iters", 2)
    result = _train(runs, [*flags, "--save", out / "checkpoints", "--save-interval", 2])
    assert result.returncode == 0, result.stderr[-3000:]
    return out / "checkpoints"


@pytest.fixture(scope="module")
def vocabularies(shared_data, tmp_path_factory) -> dict[str, Path]:
    """`swapped`: ids 262 and 286 exchanged (size and EOD unchanged); `small`: the first 4095
    tokens and <|endoftext|> as 4095, with the merges that make them (`small-merges.txt`)."""
    folder = tmp_path_factory.mktemp("vocabularies")
    vocab = json.loads((shared_data / TINY.format("vocab.json")).read_text())
    by_id = {i: token for token, i in vocab.items()}
    swapped = dict(vocab)
    swapped[by_id[262]], swapped[by_id[286]] = 286, 262
    small = {token: i for token, i in vocab.items() if i < 4095}
    small["<|endoftext|>"] = 4095
    merges = (shared_data / TINY.format("merges.txt")).read_text().splitlines()
    kept = [line for line in merges[1:] if "".join(line.split(" ")) in small]
    (folder / "small-merges.txt").write_text("\n".join([merges[0], *kept]) + "\n")
    paths = {}
    for name, content in (("swapped", swapped), ("small", small)):
        paths[name] = folder / f"{name}-vocab.json"
        paths[name].write_text(json.dumps(content))
    return paths


@pytest.fixture(scope="module")
def universal(runs, trained, tmp_path_factory) -> Path:
    """The checkpoint through mds-merge-mp --with-optimizer (meta.json keeps its tokenizer)."""
    return runs.universal_of(trained, tmp_path_factory.mktemp("tokenizer-universal") / "universal")


def _refused(result, vocab: Path, trained_vocab: Path, out: Path, words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines[-1].startswith(ERROR + "--load "), result.stderr
    line = lines[-1]
    assert f"the model was trained with {trained_vocab.resolve()} + " in line, line
    assert f"but the tokenizer flags name {vocab.resolve()} + " in line, line
    assert f": {words}; " in line and line.endswith(
        "or add --allow-tokenizer-change if the change is meant"
    ), line
    assert not (out / "metrics.jsonl").exists()  # refused before training


@pytest.mark.parametrize("how", ["load", "universal"])
def test_another_tokenizer_of_the_same_size_is_refused(
    runs, shared_data, data_cache, trained, universal, vocabularies, tmp_path, how
):
    vocab = vocabularies["swapped"]
    load = ["--load", trained] if how == "load" else ["--universal-checkpoint", "--load", universal]
    flags = _flags(runs, shared_data, data_cache, tmp_path, vocab, "--train-iters", 3, *load)
    result = _train(runs, flags)
    trained_vocab = shared_data / TINY.format("vocab.json")
    _refused(result, vocab, trained_vocab, tmp_path, "token ids mean different things")


def test_a_smaller_vocabulary_through_a_universal_checkpoint_is_refused(
    runs, shared_data, data_cache, universal, vocabularies, tmp_path
):
    vocab = vocabularies["small"]
    flags = _flags(runs, shared_data, data_cache, tmp_path, vocab)
    flags[flags.index("--merge-file") + 1] = str(vocab.with_name("small-merges.txt"))
    load = ["--universal-checkpoint", "--load", universal, "--train-iters", 3]
    result = _train(runs, [*flags, *load])
    # Its EOD (4095) is the first difference told: the record holds the EOD trained with.
    _refused(
        result,
        vocab,
        shared_data / TINY.format("vocab.json"),
        tmp_path,
        "end of document is id 4095, the checkpoint's was 4999",
    )


def test_a_vocabulary_larger_than_the_rows_is_refused_even_when_allowed(
    runs, shared_data, data_cache, universal, tmp_path
):
    vocab = shared_data / "gpt2-vocab.json"
    flags = _flags(runs, shared_data, data_cache, tmp_path, vocab)
    merges = flags.index("--merge-file") + 1
    flags[merges] = str(shared_data / "gpt2-merges.txt")
    load = ["--universal-checkpoint", "--load", universal, "--allow-tokenizer-change"]
    result = _train(runs, [*flags, *load, "--train-iters", "3"])
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and line == (
        f"{ERROR}--load {universal / 'global_step2'}: the model has 5120 embedding rows, but "
        f"the tokenizer flags name {vocab.resolve()} + "
        f"{(shared_data / 'gpt2-merges.txt').resolve()} with 50257 ids; pass the tokenizer it "
        "was trained with (its meta.json records it)"
    ), result.stderr


def test_an_allowed_change_trains_and_is_recorded(
    runs, shared_data, data_cache, trained, vocabularies, tmp_path
):
    vocab = vocabularies["swapped"]
    flags = _flags(runs, shared_data, data_cache, tmp_path, vocab, "--train-iters", 3)
    save = ["--save", tmp_path / "checkpoints", "--save-interval", 3]
    result = _train(runs, [*flags, "--load", trained, "--allow-tokenizer-change", *save])
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(runs.losses(tmp_path)) == [3]
    meta = json.loads((tmp_path / "checkpoints" / "global_step3" / "meta.json").read_text())
    assert meta["tokenizer"]["vocab_file"] == str(vocab.resolve())
    assert (meta["tokenizer"]["vocab_size"], meta["model"]["padded_vocab_size"]) == (5000, 5120)
