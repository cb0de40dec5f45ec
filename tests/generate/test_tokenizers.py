"""mds-generate reads any tokenizer through mds_tokenize's one interface (issue: any Hugging Face
tokenizer): a WordPiece `tokenizer.json` trained here with `tokenizers`, found in a Hugging Face
folder, carried into an mds checkpoint by `import-hf` and out again by `export-hf`, or named by
the flags. Prompts are encoded and completions decoded as `tokenizers` itself does, and the tokens
are `transformers`' greedy ones; a tokenizer other than the model's gets one line."""

import json
import subprocess
import sys

import pytest
import tokenizers
import transformers
from mds_checkpoint.cli import main as merge_mp
from mds_generate.cli import main

PROMPTS = ["The history of the city", "In 1998 the company announced that it", "Hello"]
NEW_TOKENS = 8


def run(capsys, tool, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        tool([str(arg) for arg in args])
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory, shared_data):
    """A BERT-style WordPiece tokenizer.json (600 ids, `</s>` ends documents) trained on 200
    OpenWebText documents, and a random tiny GPT of that vocabulary as a Hugging Face folder."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    lines = (shared_data / "openwebtext-1000.jsonl").read_text().splitlines()[:200]
    tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=["[UNK]", "</s>"])
    tokenizer.train_from_iterator((json.loads(line)["text"] for line in lines), trainer)
    return tokenizer


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, wordpiece, helpers):
    from mds_model import GPT

    config = helpers.tiny_config(vocab_size=wordpiece.get_vocab_size())
    model = GPT(config, init_seed=11).eval()
    folder = tmp_path_factory.mktemp("wordpiece") / "gpt"
    helpers.write_hf_folder(folder, model, eos=wordpiece.token_to_id("</s>"))
    wordpiece.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def expected(hf_folder, helpers):
    """Each prompt's record as `tokenizers` and `transformers` make it: the prompt's ids, the
    greedy new ids, and their text."""
    tokenizer = tokenizers.Tokenizer.from_file(str(hf_folder / "tokenizer.json"))
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_folder).eval()
    records = []
    for prompt in PROMPTS:
        ids = helpers.greedy_hf(model, tokenizer.encode(prompt).ids, NEW_TOKENS)
        completion = tokenizer.decode(ids, skip_special_tokens=False)
        records.append({"prompt": prompt, "completion": completion, "token_ids": ids})
    return records


def generated(capsys, tmp_path, load, *flags) -> list[dict]:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "out.jsonl"
    code, _, err = run(
        capsys, main, "--load", load, "--sample-input-file", prompts, "--sample-output-file", out,
        "--greedy", "--ignore-eod", "--device", "cpu", "--max-new-tokens", NEW_TOKENS, *flags,
    )  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in out.read_text().splitlines()]
    return [{key: r[key] for key in ("prompt", "completion", "token_ids")} for r in records]


def test_a_folders_tokenizer_json_through_import_and_export(capsys, tmp_path, hf_folder, expected):
    assert generated(capsys, tmp_path, hf_folder) == expected
    # import-hf records the folder's tokenizer.json in meta.json: no tokenizer flags needed.
    checkpoint = tmp_path / "checkpoint"
    code, _, err = run(
        capsys, merge_mp, "import-hf", "--load", hf_folder, "--save", checkpoint,
        "--target-tensor-model-parallel-size", 2,
    )  # fmt: skip
    assert code == 0, err
    assert generated(capsys, tmp_path, checkpoint) == expected
    # export-hf carries the tokenizer.json into the new folder.
    exported = tmp_path / "exported"
    code, _, err = run(capsys, merge_mp, "export-hf", "--load", checkpoint, "--save", exported)
    assert code == 0, err
    tokenizer_json = (hf_folder / "tokenizer.json").read_bytes()
    assert (exported / "tokenizer.json").read_bytes() == tokenizer_json
    assert generated(capsys, tmp_path, exported) == expected
    # The flags naming the same file are the same tokenizer.
    flags = ("--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path", hf_folder)
    assert generated(capsys, tmp_path, checkpoint, *flags) == expected


def test_another_tokenizer_is_one_line(capsys, tmp_path, hf_folder, shared_data):
    checkpoint = tmp_path / "checkpoint"
    code, _, err = run(capsys, merge_mp, "import-hf", "--load", hf_folder, "--save", checkpoint)
    assert code == 0, err
    # Same size and end-of-document, two ids swapped: another tokenizer all the same.
    swapped = json.loads((hf_folder / "tokenizer.json").read_text())
    vocab = swapped["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(swapped))
    prompt = ("--prompt", "x", "--device", "cpu", "--max-new-tokens", 1)
    code, out, err = run(
        capsys, main, "--load", checkpoint, *prompt, "--tokenizer-type", "PretrainedFromHF",
        "--tokenizer-name-or-path", other,
    )  # fmt: skip
    assert (code, out) == (1, "") and len(err.splitlines()) == 1
    assert err.startswith(
        f"mds-generate: error: --load {checkpoint}: the model was trained with PretrainedFromHF "
        f"{(hf_folder / 'tokenizer.json').resolve()}, but the tokenizer flags name "
        f"PretrainedFromHF {other.resolve()}: token ids mean different things"
    ), err
    code, _, err = run(
        capsys, main, "--load", checkpoint, *prompt, "--tokenizer-type", "GPT2BPETokenizer"
    )
    assert code == 1 and err == (
        f"mds-generate: error: --tokenizer-type GPT2BPETokenizer, but {checkpoint} was trained "
        "with a PretrainedFromHF tokenizer; drop the flag or pass the tokenizer's files too\n"
    )
    vocab_file = shared_data / "gpt2-vocab.json"
    code, _, err = run(capsys, main, "--load", checkpoint, *prompt, "--vocab-file", vocab_file)
    assert code == 2 and "Missing option '--merge-file'" in err and len(err.splitlines()) == 1
    code, _, err = run(capsys, main, "--load", checkpoint, *prompt, "--tokenizer-type", "Bert")
    assert code == 2 and err.startswith("mds-generate: error: --tokenizer-type Bert: choose ")


COMPARE_WITHOUT_INDEXED_DATA = """
import sys
from types import SimpleNamespace

from mds_common.tokenizer_record import TokenizerRecord
from mds_generate.loading import check_vocabulary
from mds_tokenize import load_tokenizer

tokenizer = load_tokenizer(vocab_file=sys.argv[1], merge_file=sys.argv[2])
model = SimpleNamespace(vocab_size=50257)
flags = dict(name=sys.argv[1], compare_files="--load ckpt")
check_vocabulary(tokenizer, model, tokenizer.record(), **flags)
other = TokenizerRecord.of(type="PretrainedFromHF", tokenizer_file="/t.json", tokenizer_sha256="0")
try:
    check_vocabulary(tokenizer, model, other, **flags)
except ValueError as error:
    print(error)
print(sorted(name for name in sys.modules if name.startswith("mds_indexed_data")))
"""


def test_comparing_a_checkpoints_tokenizer_needs_no_dataset_package(shared_data):
    """mds-generate compares the flags' tokenizer with meta.json's through the record alone; it
    used to import mds_indexed_data (the dataset package) to do it."""
    vocab, merges = shared_data / "gpt2-vocab.json", shared_data / "gpt2-merges.txt"
    result = subprocess.run(
        [sys.executable, "-c", COMPARE_WITHOUT_INDEXED_DATA, str(vocab), str(merges)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    refusal, modules = result.stdout.splitlines()
    assert refusal.startswith(
        "--load ckpt: the model was trained with PretrainedFromHF /t.json, but the tokenizer flags "
        f"name {vocab.resolve()} + {merges.resolve()}: another kind of tokenizer"
    )
    assert modules == "[]"
