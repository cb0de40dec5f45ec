"""The tokenizer record every tool writes and compares (mds_common.tokenizer_record): each form a
sidecar or meta.json has held reads and writes back unchanged, `same_as` follows the files'
contents (a copy elsewhere is the same tokenizer), the EOD and the kind, and the embedding rows
cover every id. The expected hashes are hashlib's own over the files' bytes, not the record's."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mds_common.tokenizer_record import (
    GPT2_BPE,
    GPT_SENTENCEPIECE,
    HF_TOKENIZER,
    PRETRAINED_FROM_HF,
    SENTENCEPIECE,
    TokenizerRecord,
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def gpt2_files(tmp_path) -> tuple[Path, Path]:
    vocab, merges = tmp_path / "vocab.json", tmp_path / "merges.txt"
    vocab.write_text(json.dumps({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}))
    merges.write_text("#version: 0.2\na b\n")
    return vocab, merges


@pytest.fixture
def tokenizer_json(tmp_path) -> Path:
    path = tmp_path / "hf" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text('{"model": {"type": "WordLevel"}}')
    return path


def gpt2_record(vocab: Path, merges: Path, **fields) -> TokenizerRecord:
    return TokenizerRecord.of_files(GPT2_BPE, [vocab, merges], vocab_size=4, eod_id=3, **fields)


# Every form written so far, as files hold it (key order included).
OLD_FORMS = {
    "sidecar vocabulary (mds-tokenize, GPT-2)": {
        "type": "GPT2BPETokenizer",
        "vocab_file": "/d/vocab.json",
        "merge_file": "/d/merges.txt",
        "vocab_sha256": "1" * 64,
        "merge_sha256": "2" * 64,
        "vocab_size": 50257,
        "eod_id": 50256,
    },
    "sidecar vocabulary (mds-tokenize, Hugging Face)": {
        "type": "PretrainedFromHF",
        "name_or_path": "tok/",
        "tokenizer_file": "/d/tok/tokenizer.json",
        "tokenizer_sha256": "3" * 64,
        "vocab_size": 5,
        "eod_id": None,
        "eod_token": None,
    },
    "sidecar vocabulary of a hub name": {
        "type": "PretrainedFromHF",
        "name_or_path": "gpt2",
        "tokenizer_file": None,
        "tokenizer_sha256": "4" * 64,
        "vocab_size": 50257,
        "eod_id": 50256,
        "eod_token": "<|endoftext|>",
    },
    "older sidecar vocabulary (no type, no size)": {
        "vocab_file": "/d/vocab.json",
        "merge_file": "/d/merges.txt",
        "vocab_sha256": "1" * 64,
        "merge_sha256": "2" * 64,
    },
    "meta.json before hashes (mds-train)": {
        "type": "GPT2BPETokenizer",
        "vocab_file": "/d/vocab.json",
        "merge_file": "/d/merges.txt",
        "vocab_size": 50257,
        "eod_id": 50256,
    },
    "meta.json of import-hf from a folder without tokenizer files": {
        "vocab_size": 50257,
        "eod_id": None,
    },
    "Megatron args' fields": {
        "type": "GPT2BPETokenizer",
        "vocab_file": None,
        "merge_file": None,
        "vocab_size": 50257,
    },
}


@pytest.mark.parametrize("form", OLD_FORMS.values(), ids=list(OLD_FORMS))
def test_every_recorded_form_reads_and_writes_back_unchanged(form):
    written = TokenizerRecord.from_json(form).to_json()
    assert written == form
    assert json.dumps(written) == json.dumps(form)  # the same key order: the same file


def test_sidecar_forms(gpt2_files):
    vocab, merges = map(str, gpt2_files)
    record = {"type": GPT2_BPE, "vocab_file": vocab, "merge_file": merges}
    assert TokenizerRecord.from_sidecar({"vocabulary": record}).to_json() == record
    # Older mds-tokenize sidecars: the flags in `config`, or in the first shard's sidecar.
    config = {"vocab_file": vocab, "merge_file": merges, "input": "x.jsonl"}
    expected = {"vocab_file": vocab, "merge_file": merges}
    assert TokenizerRecord.from_sidecar({"config": config}).to_json() == expected
    sharded = {"shard_metadata": [{"tool": "x"}, {"config": config}]}
    assert TokenizerRecord.from_sidecar(sharded).to_json() == expected
    assert TokenizerRecord.from_sidecar({"tool": "mds-index merge"}) is None
    assert TokenizerRecord.from_sidecar({"vocabulary": {}}) is None


def test_files_are_recorded_by_absolute_path_and_hash(gpt2_files, tokenizer_json):
    vocab, merges = gpt2_files
    assert gpt2_record(vocab, merges).to_json() == {
        "type": "GPT2BPETokenizer",
        "vocab_file": str(vocab.resolve()),
        "merge_file": str(merges.resolve()),
        "vocab_sha256": sha256(vocab),
        "merge_sha256": sha256(merges),
        "vocab_size": 4,
        "eod_id": 3,
    }
    hf = TokenizerRecord.of_files(PRETRAINED_FROM_HF, [tokenizer_json])
    assert hf.to_json() == {
        "type": "PretrainedFromHF",
        "tokenizer_file": str(tokenizer_json.resolve()),
        "tokenizer_sha256": sha256(tokenizer_json),
    }
    assert hf.files == (str(tokenizer_json.resolve()),)
    assert gpt2_record(vocab, merges).files == (str(vocab.resolve()), str(merges.resolve()))
    assert TokenizerRecord.from_json(OLD_FORMS["Megatron args' fields"]).files == (None, None)


def test_updated_keeps_positions_and_appends_new_keys():
    record = TokenizerRecord.from_json(OLD_FORMS["sidecar vocabulary (mds-tokenize, GPT-2)"])
    changed = record.updated(vocab_size=50304, eod_id=0).to_json()
    assert list(changed) == list(OLD_FORMS["sidecar vocabulary (mds-tokenize, GPT-2)"])
    assert (changed["vocab_size"], changed["eod_id"]) == (50304, 0)
    assert TokenizerRecord().updated(vocab_size=8, eod_id=None).to_json() == {
        "vocab_size": 8,
        "eod_id": None,
    }


def test_a_copy_of_the_files_elsewhere_is_the_same_tokenizer(gpt2_files, tmp_path):
    vocab, merges = gpt2_files
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    copies = [Path(shutil.copy(path, elsewhere)) for path in (vocab, merges)]
    original = gpt2_record(vocab, merges)
    assert original.same_as(gpt2_record(*copies))
    # Paths only (an older sidecar): hashed from the files while they are readable.
    paths_only = TokenizerRecord.of(vocab_file=str(copies[0]), merge_file=str(copies[1]))
    assert original.same_as(paths_only) and paths_only.same_as(original)
    copies[1].write_text("#version: 0.2\nb a\n")  # other merges: other ids
    assert not original.same_as(gpt2_record(*copies))


def test_files_gone_are_compared_by_path(tmp_path):
    gone = TokenizerRecord.of(vocab_file=str(tmp_path / "v"), merge_file=str(tmp_path / "m"))
    assert gone.same_as(TokenizerRecord.from_json(gone.to_json()))
    other = TokenizerRecord.of(vocab_file=str(tmp_path / "v2"), merge_file=str(tmp_path / "m"))
    assert not gone.same_as(other)


def test_a_different_eod_is_a_different_tokenizer(gpt2_files):
    record = gpt2_record(*gpt2_files)
    assert not record.same_as(record.updated(eod_id=0))
    assert record.same_as(record.updated(eod_id=None))  # recorded by one side only


def test_hugging_face_and_gpt2_files_are_different_tokenizers(gpt2_files, tokenizer_json):
    gpt2 = gpt2_record(*gpt2_files)
    hf = TokenizerRecord.of_files(PRETRAINED_FROM_HF, [tokenizer_json], eod_id=3)
    assert not gpt2.same_as(hf) and not hf.same_as(gpt2)
    assert hf.same_as(TokenizerRecord.of(type=PRETRAINED_FROM_HF, tokenizer_file=hf.tokenizer_file))
    hub = TokenizerRecord.from_json(OLD_FORMS["sidecar vocabulary of a hub name"])
    assert not hub.same_as(hf)
    assert hub.same_as(hub.updated(name_or_path="another/name"))  # by the serialized hash


def test_upstream_s_tokenizer_model_kinds_are_told_apart(tmp_path, tokenizer_json):
    """deepspeedai's --tokenizer-model kinds: one file each (tokenizer_file), the kind is part of
    the identity (one model read two ways gives other ids), a copy elsewhere is the same."""
    model = tmp_path / "tokenizer.model"
    model.write_bytes(b"a SentencePiece model's bytes")
    gpt = TokenizerRecord.of_files(GPT_SENTENCEPIECE, [model], vocab_size=500, eod_id=2)
    assert gpt.to_json()["tokenizer_sha256"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert (gpt.kind, gpt.files, gpt.is_hugging_face) == (GPT_SENTENCEPIECE, (str(model),), False)
    assert gpt.label() == f"GPTSentencePieceTokenizer {model}"
    plain = TokenizerRecord.of_files(SENTENCEPIECE, [model], vocab_size=505)
    assert not gpt.same_as(plain) and not plain.same_as(gpt)
    copy = tmp_path / "elsewhere.model"
    shutil.copyfile(model, copy)
    assert gpt.same_as(TokenizerRecord.of_files(GPT_SENTENCEPIECE, [copy], eod_id=2))
    # Megatron's args: the path only, hashed while the file is here
    assert TokenizerRecord.of(type=GPT_SENTENCEPIECE, tokenizer_file=str(copy)).same_as(gpt)
    upstream_hf = TokenizerRecord.of_files(HF_TOKENIZER, [tokenizer_json])
    ours_hf = TokenizerRecord.of_files(PRETRAINED_FROM_HF, [tokenizer_json])
    assert upstream_hf.is_hugging_face and upstream_hf.kind == HF_TOKENIZER
    assert not upstream_hf.same_as(ours_hf)
    # an older sidecar: a tokenizer.json hash without a type is PretrainedFromHF
    older = TokenizerRecord.of(tokenizer_sha256=ours_hf.tokenizer_sha256)
    assert older.kind == PRETRAINED_FROM_HF


def test_a_tokenizer_in_memory_matches_only_an_equal_record(gpt2_files):
    in_memory = TokenizerRecord.of(type=GPT2_BPE, vocab_size=4, eod_id=3)
    assert in_memory.same_as(TokenizerRecord.of(type=GPT2_BPE, vocab_size=4, eod_id=3))
    assert not in_memory.same_as(gpt2_record(*gpt2_files))
    assert not in_memory.same_as(TokenizerRecord.of(type=GPT2_BPE, vocab_size=5, eod_id=3))


def test_labels_name_the_files(gpt2_files, tokenizer_json):
    vocab, merges = gpt2_files
    assert gpt2_record(vocab, merges).label() == f"{vocab.resolve()} + {merges.resolve()}"
    hf = TokenizerRecord.of_files(PRETRAINED_FROM_HF, [tokenizer_json])
    assert hf.label() == f"PretrainedFromHF {tokenizer_json.resolve()}"
    hub = TokenizerRecord.from_json(OLD_FORMS["sidecar vocabulary of a hub name"])
    assert hub.label() == "PretrainedFromHF gpt2"


def test_embedding_rows_cover_every_id():
    # Ids 0..9 with gaps: 6 entries, but the largest id needs row 9.
    assert TokenizerRecord.of(vocab_size=6, max_token_id=9).embedding_rows() == 10
    assert TokenizerRecord.of(vocab_size=50257, max_token_id=50256).embedding_rows() == 50257
    # Read from a file (meta.json's vocab_size is already the rows trained): the size itself.
    assert TokenizerRecord.from_json({"vocab_size": 10}).embedding_rows() == 10
    assert "max_token_id" not in TokenizerRecord.of(vocab_size=6, max_token_id=9).to_json()


def test_names_tokenizer():
    """Whether a record says which tokenizer it is (mds-generate compares the files then)."""
    names = {
        name: TokenizerRecord.from_json(form).names_tokenizer for name, form in OLD_FORMS.items()
    }
    assert [name for name, named in names.items() if not named] == [
        "meta.json of import-hf from a folder without tokenizer files"
    ]
    assert not TokenizerRecord() and TokenizerRecord.of(eod_id=None)  # records something


def test_bad_records_are_refused():
    with pytest.raises(ValueError, match="a tokenizer record is a JSON object, not str"):
        TokenizerRecord.from_json("gpt2")
    with pytest.raises(TypeError, match="not tokenizer record keys"):
        TokenizerRecord.of(vocab="x")


def test_the_record_imports_nothing_beyond_the_standard_library():
    code = (
        "import sys, mds_common.tokenizer_record; "
        "print(sorted(m for m in ('numpy', 'torch', 'typer') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
