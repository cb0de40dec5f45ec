"""export-hf puts only the checkpoint's own tokenizer beside the weights: files given with
--vocab-file/--merge-file (or the ones meta.json names) go through mds_tokenize's one check
against the checkpoint's record, and --eos-token-id must be an id of the model's vocabulary.
Before, another vocabulary's files and any id were written as given, and transformers then encoded
text with the wrong ids."""

import json
from pathlib import Path

from mds_common.tokenizer_record import TokenizerRecord
from mds_tokenize import check_checkpoint_tokenizer
from mds_tokenize.interface import load_tokenizer

TINY = "megatron-golden/gpt2-tiny-{}"


def swapped_vocabulary(shared_data: Path, folder: Path) -> Path:
    """The tiny vocabulary with ids 262 and 286 swapped: same size, same EOD, another tokenizer."""
    vocab = json.loads((shared_data / TINY.format("vocab.json")).read_text())
    by_id = {i: token for token, i in vocab.items()}
    vocab[by_id[262]], vocab[by_id[286]] = 286, 262
    path = folder / "swapped-vocab.json"
    path.write_text(json.dumps(vocab))
    return path


def test_another_vocabulary_is_refused_and_nothing_written(
    merge_mp, tp2pp2_checkpoint, shared_data, tmp_path
):
    merges = shared_data / TINY.format("merges.txt")
    swapped = swapped_vocabulary(shared_data, tmp_path)
    out = tmp_path / "hf"
    result = merge_mp(
        "export-hf", "--load", tp2pp2_checkpoint, "--save", out,
        "--vocab-file", swapped, "--merge-file", merges,
    )  # fmt: skip
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(
        f"mds-merge-mp export-hf: error: --load {tp2pp2_checkpoint}: the model was trained with "
        f"{(shared_data / TINY.format('vocab.json')).resolve()} + {merges.resolve()}, but the "
        f"tokenizer flags name {swapped.resolve()} + {merges.resolve()}: token ids mean different "
        "things; "
    ), result.stderr
    assert not out.exists()


def test_a_vocabulary_larger_than_the_model_is_refused(
    merge_mp, tp2pp2_checkpoint, shared_data, tmp_path
):
    gpt2 = ("--vocab-file", shared_data / "gpt2-vocab.json")
    result = merge_mp(
        "export-hf", "--load", tp2pp2_checkpoint, "--save", tmp_path / "hf",
        *gpt2, "--merge-file", shared_data / "gpt2-merges.txt",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert (
        "the model has 5000 embedding rows, but the tokenizer flags name "
        f"{(shared_data / 'gpt2-vocab.json').resolve()}"
    ) in result.stderr
    assert "with 50257 ids" in result.stderr and not (tmp_path / "hf").exists()


def test_the_checkpoint_s_own_files_are_accepted(
    merge_mp, tp2pp2_checkpoint, shared_data, tmp_path
):
    files = ("--vocab-file", shared_data / TINY.format("vocab.json"))
    files += ("--merge-file", shared_data / TINY.format("merges.txt"))
    result = merge_mp("export-hf", "--load", tp2pp2_checkpoint, "--save", tmp_path / "hf", *files)
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["vocab_size"], config["eos_token_id"]) == (5000, 4999)


def test_an_eos_id_outside_the_vocabulary_is_refused(merge_mp, tp2pp2_checkpoint, tmp_path):
    for eos in ("999999", "5000", "-1"):
        result = merge_mp(
            "export-hf", "--load", tp2pp2_checkpoint, "--save", tmp_path / "hf",
            "--eos-token-id", eos,
        )  # fmt: skip
        assert result.returncode == 1, result.stderr
        assert result.stderr == (
            f"mds-merge-mp export-hf: error: --eos-token-id {eos}: not an id of the model's "
            "vocabulary (0 to 4999); give its end-of-document id, or drop the flag\n"
        )
        assert not (tmp_path / "hf").exists()


def test_the_one_check_by_what_a_record_can_tell(shared_data, tmp_path):
    """mds_tokenize.check_checkpoint_tokenizer, the check every tool runs where a checkpoint
    meets a tokenizer: EOD, kind, contents and size where mds recorded them; a Megatron record
    (paths of another machine, no hashes) only by kind and the model's rows."""
    vocab, merges = shared_data / TINY.format("vocab.json"), shared_data / TINY.format("merges.txt")
    given = load_tokenizer(vocab_file=vocab, merge_file=merges).record()
    recorded = given.updated(vocab_size=5000, eod_id=4999)  # what mds-train writes
    check_checkpoint_tokenizer(recorded, given, checkpoint="C", model_rows=5120)
    swapped = load_tokenizer(
        vocab_file=swapped_vocabulary(shared_data, tmp_path), merge_file=merges
    ).record()
    refusals = {
        "token ids mean different things": (recorded, swapped),
        "end of document is id 4999, the checkpoint's was 3": (
            recorded.updated(eod_id=3),
            given,
        ),
        "5000 ids where the model was trained with 4096": (
            recorded.updated(vocab_size=4096),
            given,
        ),
        "another kind of tokenizer": (
            TokenizerRecord.of(type="PretrainedFromHF", tokenizer_file="/t.json"),
            given,
        ),
    }
    for words, (theirs, ours) in refusals.items():
        try:
            check_checkpoint_tokenizer(theirs, ours, checkpoint="C", change_flag="--allow-x")
        except ValueError as error:
            assert str(error).startswith("C: the model was trained with "), error
            assert f": {words}; pass the tokenizer it was trained with" in str(error)
            assert str(error).endswith(", or add --allow-x if the change is meant")
        else:
            raise AssertionError(f"not refused: {words}")
        # The flag lets a change through whose ids fit the rows...
        check_checkpoint_tokenizer(theirs, ours, checkpoint="C", change_allowed=True)
    # ...and never one whose ids do not.
    try:
        check_checkpoint_tokenizer(recorded, given, checkpoint="C", model_rows=4096)
    except ValueError as error:
        assert "the model has 4096 embedding rows" in str(error) and "with 5000 ids" in str(error)
    else:
        raise AssertionError("5000 ids in 4096 rows")
    # Megatron's args name files of the machine that trained (and perhaps a padded size).
    megatron = TokenizerRecord.of(
        type="GPT2BPETokenizer", vocab_file="/elsewhere/v.json", merge_file="/elsewhere/m.txt",
        vocab_size=5120,
    )  # fmt: skip
    check_checkpoint_tokenizer(megatron, swapped, checkpoint="C", model_rows=5120)
    # The same record where its files are here is compared by content.
    here = megatron.updated(vocab_file=str(vocab), merge_file=str(merges))
    check_checkpoint_tokenizer(here, given, checkpoint="C", model_rows=5120)
    try:
        check_checkpoint_tokenizer(here, swapped, checkpoint="C", model_rows=5120)
    except ValueError as error:
        assert "token ids mean different things" in str(error)
    else:
        raise AssertionError("not compared by content")
