"""import-hf takes the tokenizer flags upstream's converter reads
(tools/hf2megads_weight_converter.py gets the script's `--tokenizer-type HFTokenizer
--tokenizer-model $HF_LLAMA_PATH`) and records that tokenizer in meta.json, so that mds-train's
--load check passes the same flags (and refuses another tokenizer); without them the folder's own
tokenizer.json is recorded as PretrainedFromHF. Before, the folder's was always recorded, and
upstream's convert-then-finetune line was refused as "another kind of tokenizer" unless the run
added --allow-tokenizer-change."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from mds_checkpoint import CheckpointMeta, Parallel, read_meta
from mds_common.tokenizer_record import file_sha256
from mds_tokenize.flags import TokenizerFlags
from mds_train.checkpointing import check_tokenizer
from mds_train.data import read_vocabulary
from safetensors.torch import load_file

SPECIALS = ["<unk>", "<s>", "</s>"]


def hf_llama(folder: Path, *, vocab_size: int, num_tokens: int) -> Path:
    """A tiny LlamaForCausalLM of `vocab_size` rows beside a word-level tokenizer.json of
    `num_tokens` ids (no pad token: HFTokenizer adds `[PAD]` as id `num_tokens`), eos `</s>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        tie_word_embeddings=False,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    words = SPECIALS + [f"w{i}" for i in range(len(SPECIALS), num_tokens)]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(special))
    return folder


def run_meta(**flags) -> CheckpointMeta:
    """What mds-train records for its tokenizer flags (`Vocabulary.meta_record`)."""
    unset = dict.fromkeys(f.name for f in dataclasses.fields(TokenizerFlags))
    data = SimpleNamespace(**{**unset, **flags})  # the DataSection fields read_vocabulary reads
    return CheckpointMeta(
        model={}, parallel=Parallel(), tokenizer=read_vocabulary(data).meta_record()
    )


def train_check(imported: Path, **flags) -> None:
    """mds-train's --load tokenizer check of the imported checkpoint, without
    --allow-tokenizer-change."""
    folder = imported / "global_step0"
    check_tokenizer(read_meta(folder), run_meta(**flags), folder, change_allowed=False)


HF_TOKENIZER = ("--tokenizer-type", "HFTokenizer", "--tokenizer-model")


def test_the_converter_s_tokenizer_flags_are_recorded_and_pass_the_train_check(merge_mp, tmp_path):
    hf = hf_llama(tmp_path / "hf", vocab_size=200, num_tokens=200)
    out = tmp_path / "imported"
    result = merge_mp(
        "import-hf", "--load", hf, "--save", out, "--target-tensor-model-parallel-size", "2",
        *HF_TOKENIZER, hf,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "global_step0" / "meta.json").read_text())
    tokenizer_json = (hf / "tokenizer.json").resolve()
    assert meta["tokenizer"] == {
        "type": "HFTokenizer",
        "name_or_path": str(hf),
        "tokenizer_file": str(tokenizer_json),
        "tokenizer_sha256": file_sha256(tokenizer_json),
        "vocab_size": 201,  # as HFTokenizer counts: `[PAD]` added as id 200
        "eod_id": 2,  # `</s>`, upstream's eod
        "eod_token": "</s>",
    }
    # the tokenizer's ids are the model's vocabulary (as a run with its flags writes it)
    assert meta["model"]["vocab_size"] == 201 and meta["model"]["padded_vocab_size"] == 256
    hf_model = str(hf)
    train_check(out, tokenizer_type="HFTokenizer", tokenizer_model=hf_model)  # passes
    # The same file read the other way is another tokenizer (no [PAD]), still refused.
    with pytest.raises(ValueError, match="another kind of tokenizer"):
        train_check(out, tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=hf_model)
    other = hf_llama(tmp_path / "other", vocab_size=200, num_tokens=199)
    with pytest.raises(ValueError, match="token ids mean different things"):
        train_check(out, tokenizer_type="HFTokenizer", tokenizer_model=str(other))
    # export-hf keeps a row for each id of the recorded tokenizer: [PAD]'s is a zero row
    result = merge_mp("export-hf", "--load", out, "--save", tmp_path / "exported")
    assert result.returncode == 0, result.stderr
    original = load_file(hf / "model.safetensors")
    exported = load_file(tmp_path / "exported" / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert exported[name].shape == (201, 32), name
        assert torch.equal(exported[name][:200], original[name]) and not exported[name][200].any()


def test_without_tokenizer_flags_the_folder_s_own_is_recorded(merge_mp, tmp_path):
    hf = hf_llama(tmp_path / "hf", vocab_size=200, num_tokens=200)
    out = tmp_path / "imported"
    result = merge_mp("import-hf", "--load", hf, "--save", out)
    assert result.returncode == 0, result.stderr
    recorded = json.loads((out / "global_step0" / "meta.json").read_text())["tokenizer"]
    assert (recorded["type"], recorded["vocab_size"]) == ("PretrainedFromHF", 200)
    train_check(out, tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(hf))
    with pytest.raises(ValueError, match="another kind of tokenizer"):
        train_check(out, tokenizer_type="HFTokenizer", tokenizer_model=str(hf))


def test_a_tokenizer_whose_ids_the_rows_do_not_hold_is_refused(merge_mp, tmp_path):
    # 256 rows (256 padded to a multiple of 128); HFTokenizer's `[PAD]` is id 256.
    hf = hf_llama(tmp_path / "hf", vocab_size=256, num_tokens=256)
    out = tmp_path / "imported"
    result = merge_mp("import-hf", "--load", hf, "--save", out, *HF_TOKENIZER, hf)
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr == (
        f"mds-merge-mp import-hf: error: {hf / 'config.json'}: the model has 256 embedding rows "
        "(vocab_size 256, padded), but the tokenizer flags name "
        f"HFTokenizer {(hf / 'tokenizer.json').resolve()} with 257 ids; raise "
        "--make-vocab-size-divisible-by until the rows hold them, or name the tokenizer the "
        "model was trained with\n"
    )
    assert not out.exists()
    result = merge_mp(
        "import-hf", "--load", hf, "--save", out, *HF_TOKENIZER, hf,
        "--make-vocab-size-divisible-by", "512",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "global_step0" / "meta.json").read_text())
    assert (meta["tokenizer"]["vocab_size"], meta["model"]["padded_vocab_size"]) == (257, 512)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--tokenizer-type", "HFTokenizer"), "Missing option '--tokenizer-model'"),
        (("--tokenizer-model", "x"), "--tokenizer-model is for --tokenizer-type"),
    ],
)
def test_a_misplaced_tokenizer_flag_is_a_usage_error(merge_mp, tmp_path, flags, message):
    out = tmp_path / "imported"
    result = merge_mp("import-hf", "--load", tmp_path, "--save", out, *flags)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not out.exists()
