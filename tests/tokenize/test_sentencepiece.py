"""Upstream's `--tokenizer-model` tokenizers (deepspeedai/Megatron-DeepSpeed 6acc370a's
`SentencePieceTokenizer`, `GPTSentencePieceTokenizer`, `HFTokenizer`) through mds-tokenize: a
SentencePiece model trained here with `sentencepiece` on c4_demo.jsonl gives the ids
`sentencepiece` itself gives, with each type's end of document; a Llama-3 style tokenizer.json
gives the ids of transformers' tokenizer set up as upstream's `_HFTokenizer` sets it up; and
`--deepspeedai-index` writes upstream's index (its `--append-eod` sizes without the EOD), which
mds_indexed_data reads as upstream does. Upstream's own preprocess_data.py gives the same bytes
(checked by hand: packages/tokenize/README.md, "SentencePiece tokenizers")."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
from mds_common.tokenizer_record import TokenizerRecord
from mds_indexed_data import IndexedDatasetReader
from mds_tokenize import check_checkpoint_tokenizer, load_tokenizer
from mds_tokenize.config import TokenizeConfig
from mds_tokenize.pipeline import run

NUM_DOCS = 120  # of c4_demo.jsonl's 300: enough text, a fast test
# Text that meets SentencePieceTokenizer's specials and HFTokenizer's added ones.
SPECIAL_TEXT = [
    "Hello <s> world </s> <EOD><CLS> x<MASK>y <PAD>",
    "<SEP>",
    "a [PAD] b <unk> c <|end_of_text|> d",
    "naïve 中文 😀 tabs\tand\nnewlines  ",
]


def corpus_texts(shared_data: Path) -> list[str]:
    lines = (shared_data / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines[:NUM_DOCS]]


@pytest.fixture(scope="module")
def model_file(shared_data, tmp_path_factory) -> Path:
    """A Llama-2-like SentencePiece model (BPE, byte fallback) learned from c4_demo.jsonl."""
    folder = tmp_path_factory.mktemp("sentencepiece")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_texts(shared_data)),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=500,
        model_type="bpe",
        byte_fallback=True,
        num_threads=1,
        minloglevel=2,
    )
    return folder / "tokenizer.model"


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> tuple[Path, list[str]]:
    texts = corpus_texts(shared_data)[:40] + ["", *SPECIAL_TEXT] + corpus_texts(shared_data)[40:]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path, texts


def tokenize(corpus_path: Path, prefix: Path, **flags) -> IndexedDatasetReader:
    config = TokenizeConfig(input=corpus_path, output_prefix=str(prefix), **flags)
    run(config)
    return IndexedDatasetReader(f"{prefix}_text_document")


def documents(reader: IndexedDatasetReader) -> list[list[int]]:
    return [reader[i].tolist() for i in range(len(reader))]


def upstream_sentencepiece_ids(processor, specials: dict[str, int], text: str) -> list[int]:
    """upstream's _SentencePieceTokenizer.tokenize (NeMo's), as it is written there."""
    ids, idx = [], 0
    while True:
        indices = {}
        for token in specials:
            try:
                indices[token] = text[idx:].index(token)
            except ValueError:
                continue
        if not indices:
            break
        next_token = min(indices, key=indices.get)
        next_idx = idx + indices[next_token]
        ids.extend(processor.encode_as_ids(text[idx:next_idx]))
        ids.append(specials[next_token])
        idx = next_idx + len(next_token)
    ids.extend(processor.encode_as_ids(text[idx:]))
    return ids


def test_gpt_sentencepiece_gives_sentencepiece_s_ids_and_its_eos(model_file, corpus, tmp_path):
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    path, texts = corpus
    reader = tokenize(
        path,
        tmp_path / "gpt",
        tokenizer_type="GPTSentencePieceTokenizer",
        tokenizer_model=str(model_file),
        append_eod=True,
    )
    eos = processor.eos_id()
    assert eos == 2 and reader.dtype == np.uint16
    expected = [processor.encode_as_ids(text) + [eos] for text in texts if text]
    assert documents(reader) == expected  # the empty document: no item, no EOD
    sidecar = json.loads((tmp_path / "gpt_text_document.tokenize.json").read_text())
    record = sidecar["vocabulary"]
    assert record["type"] == "GPTSentencePieceTokenizer"
    assert record["tokenizer_file"] == str(model_file.resolve())
    assert (record["vocab_size"], record["eod_id"]) == (len(processor), eos)
    tokenizer = load_tokenizer(
        tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=model_file
    )
    assert tokenizer.decode(expected[0][:-1]) == processor.decode_ids(expected[0][:-1])


def test_sentencepiece_tokenizer_adds_upstream_s_specials_and_ends_with_eod(
    model_file, corpus, tmp_path
):
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    size = len(processor)
    # <CLS> <SEP> <EOD> <MASK> <PAD> appended (the model has no pad piece); <s>, </s> its own.
    specials = {"<CLS>": size, "<SEP>": size + 1, "<EOD>": size + 2, "<MASK>": size + 3}
    specials |= {"<PAD>": size + 4, "<s>": 1, "</s>": 2}
    path, texts = corpus
    reader = tokenize(
        path,
        tmp_path / "sp",
        tokenizer_type="SentencePieceTokenizer",
        tokenizer_model=str(model_file),
        append_eod=True,
    )
    expected = [
        upstream_sentencepiece_ids(processor, specials, text) + [size + 2] for text in texts if text
    ]
    assert documents(reader) == expected
    hello = processor.encode_as_ids("Hello ")
    assert expected[40][: len(hello) + 1] == hello + [1]  # "<s>" cut out: its own id
    tokenizer = load_tokenizer(tokenizer_type="SentencePieceTokenizer", tokenizer_model=model_file)
    assert (tokenizer.vocab_size, tokenizer.eod) == (size + 5, size + 2)
    # upstream's detokenize: a special in spaces, the pieces between decoded apart
    assert tokenizer.decode(processor.encode_as_ids("a b") + [size, 5]) == (
        "a b <CLS> " + processor.decode_ids([5])
    )


def test_deepspeedai_index_is_upstream_s_and_reads_as_upstream_reads_it(
    model_file, corpus, tmp_path
):
    """upstream's preprocess_data.py --append-eod (6acc370a): each size leaves out the EOD the
    .bin holds, an empty document keeps its doc_idx entry; pointers follow the sizes."""
    path, texts = corpus
    flags = dict(
        tokenizer_type="GPTSentencePieceTokenizer",
        tokenizer_model=str(model_file),
        append_eod=True,
    )
    ours = tokenize(path, tmp_path / "ours", **flags)
    theirs = tokenize(path, tmp_path / "theirs", deepspeedai_index=True, **flags)
    data = (tmp_path / "ours_text_document.bin").read_bytes()
    assert (tmp_path / "theirs_text_document.bin").read_bytes() == data
    assert theirs.num_uncounted_eods == len(ours) == len(texts) - 1
    np.testing.assert_array_equal(theirs.sizes, ours.sizes - 1)
    empty = texts.index("")
    expected_doc_idx = [*range(empty + 1), *range(empty, len(ours) + 1)]
    assert theirs.doc_idx.tolist() == expected_doc_idx
    # read as the index says, as upstream's MMapIndexedDataset reads it: the token stream less
    # its last len(ours) tokens, cut at the sizes
    stream = np.frombuffer(data, np.uint16)
    assert np.concatenate(documents_arrays(theirs)).tolist() == stream[: -len(ours)].tolist()


def documents_arrays(reader: IndexedDatasetReader) -> list[np.ndarray]:
    return [reader[i] for i in range(len(reader))]


def test_upstream_s_llama_golden_corpus_is_written_and_read(shared_data, tmp_path):
    """The golden's corpus was written by upstream's preprocess_data.py --append-eod; the same
    flags with --deepspeedai-index write its bytes, and both read alike."""
    golden = shared_data / "megatron-deepspeed-llama-golden"
    command = [sys.executable, "-m", "mds_tokenize", "--input", shared_data / "c4_demo.jsonl"]
    command += ["--output-prefix", tmp_path / "corpus", "--tokenizer-type", "GPT2BPETokenizer"]
    command += ["--vocab-file", golden / "vocab/vocab.json"]
    command += ["--merge-file", golden / "vocab/merges.txt", "--append-eod"]
    command += ["--deepspeedai-index", "--workers", "2"]
    result = subprocess.run(list(map(str, command)), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for suffix in (".bin", ".idx"):
        written = (tmp_path / f"corpus_text_document{suffix}").read_bytes()
        assert written == (golden / f"corpus_text_document{suffix}").read_bytes(), suffix
    reader = IndexedDatasetReader(golden / "corpus_text_document")
    assert (len(reader), reader.num_uncounted_eods, reader[1][:1].tolist()) == (300, 300, [999])


def test_uncounted_tokens_of_another_kind_are_refused(tmp_path, shared_data):
    """Trailing tokens that are not one EOD per document stay an error."""
    golden = shared_data / "megatron-deepspeed-llama-golden" / "corpus_text_document"
    shutil.copyfile(f"{golden}.idx", tmp_path / "c.idx")
    data = bytearray(Path(f"{golden}.bin").read_bytes())
    data[-2:] = (998).to_bytes(2, "little")  # the last document's EOD is another id
    (tmp_path / "c.bin").write_bytes(data)
    with pytest.raises(ValueError, match="data file is 590118 bytes but its index points to"):
        IndexedDatasetReader(tmp_path / "c")


@pytest.fixture(scope="module")
def llama3_folder(shared_data, tmp_path_factory) -> Path:
    """A Llama-3 style tokenizer.json (byte-level BPE, <|begin_of_text|> prepended by its
    post-processor, specials as added tokens) and its tokenizer_config.json (bos, eos; no pad,
    no unk), as Meta's folders hold them."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus_texts(shared_data), trainer)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    tokenizer.add_special_tokens([AddedToken(token, special=True) for token in specials])
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    folder = tmp_path_factory.mktemp("llama3")
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    config |= {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_hf_tokenizer_is_upstream_s_transformers_tokenizer(llama3_folder, corpus, tmp_path):
    """upstream's _HFTokenizer: AutoTokenizer.from_pretrained(X, use_fast=False), the specials
    its config lacks added ([PAD], <unk> here), encode() with the bos, eod the eos token."""
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(llama3_folder), use_fast=False)
    missing = {"pad_token": "[PAD]", "eos_token": "</s>", "bos_token": "<s>", "unk_token": "<unk>"}
    reference.add_special_tokens(
        {key: value for key, value in missing.items() if getattr(reference, key) is None}
    )
    path, texts = corpus
    reader = tokenize(
        path,
        tmp_path / "hf",
        tokenizer_type="HFTokenizer",
        tokenizer_model=str(llama3_folder),
        append_eod=True,
    )
    eod = reference.eos_token_id
    expected = [reference.encode(text) + [eod] for text in texts]
    expected = [ids for ids, text in zip(expected, texts, strict=True) if ids[:-1]]
    assert documents(reader) == expected
    assert expected[0][0] == reference.bos_token_id  # Llama 3 starts each document with it
    pad_text = texts.index(SPECIAL_TEXT[2])
    assert reference.pad_token_id in expected[pad_text]  # "[PAD]" is a special token now
    record = json.loads((tmp_path / "hf_text_document.tokenize.json").read_text())["vocabulary"]
    assert record["type"] == "HFTokenizer" and record["eod_id"] == eod == 601
    assert record["vocab_size"] == len(reference) == 605


def test_upstream_s_hf_tokenizer_command_line_runs_as_written(llama3_folder, corpus, tmp_path):
    """preprocess_data.py's HFTokenizer line needs --seq-length (transformers' length warning
    compares with it); mds-tokenize takes it and writes what the in-process run writes."""
    command = [sys.executable, "-m", "mds_tokenize", "--input", str(corpus[0])]
    command += ["--output-prefix", str(tmp_path / "cli"), "--tokenizer-type", "HFTokenizer"]
    command += ["--tokenizer-model", str(llama3_folder), "--seq-length", "4096", "--append-eod"]
    command += ["--workers", "1", "--dataset-impl", "mmap", "--deepspeedai-index"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    flags = dict(tokenizer_type="HFTokenizer", tokenizer_model=str(llama3_folder))
    tokenize(corpus[0], tmp_path / "api", append_eod=True, deepspeedai_index=True, **flags)
    for suffix in (".bin", ".idx"):
        written = (tmp_path / f"cli_text_document{suffix}").read_bytes()
        assert written == (tmp_path / f"api_text_document{suffix}").read_bytes()


def test_records_tell_kinds_and_files_apart(model_file, tmp_path):
    gpt = load_tokenizer(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=model_file)
    plain = load_tokenizer(tokenizer_type="SentencePieceTokenizer", tokenizer_model=model_file)
    copy = tmp_path / "copy.model"
    shutil.copyfile(model_file, copy)
    again = load_tokenizer(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=copy)
    assert gpt.record().same_as(again.record())  # the same model by content, elsewhere
    assert not gpt.record().same_as(plain.record())
    recorded = TokenizerRecord.from_json(json.loads(json.dumps(gpt.record().to_json())))
    assert recorded.kind == "GPTSentencePieceTokenizer" and recorded.same_as(again.record())
    with pytest.raises(ValueError, match="end of document is id 502, the checkpoint's was 2"):
        check_checkpoint_tokenizer(recorded, plain.record(), checkpoint="--load c")
    # Megatron's args name the file by path only: compared by content where it is here
    megatron = TokenizerRecord.of(type="GPTSentencePieceTokenizer", tokenizer_file=str(copy))
    check_checkpoint_tokenizer(megatron, gpt.record(), checkpoint="--load c")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--tokenizer-type", "GPTSentencePieceTokenizer"),
            "Missing option '--tokenizer-model': --tokenizer-type GPTSentencePieceTokenizer "
            "needs the SentencePiece model file (tokenizer.model)",
        ),
        (
            ("--tokenizer-model", "tokenizer.model"),
            "--tokenizer-model is for --tokenizer-type SentencePieceTokenizer|"
            "GPTSentencePieceTokenizer|HFTokenizer, not GPT2BPETokenizer; add --tokenizer-type "
            "SentencePieceTokenizer, GPTSentencePieceTokenizer or HFTokenizer, as upstream",
        ),
    ],
)
def test_misplaced_tokenizer_model_flags_are_usage_errors(corpus, tmp_path, args, message):
    command = [sys.executable, "-m", "mds_tokenize", "--input", str(corpus[0])]
    command += ["--output-prefix", str(tmp_path / "out"), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"mds-tokenize: error: {message}"]


def test_a_file_that_is_no_model_is_one_line(corpus, tmp_path):
    with pytest.raises(ValueError, match=r"--tokenizer-model .*corpus.jsonl: not a SentencePiece"):
        load_tokenizer(tokenizer_type="SentencePieceTokenizer", tokenizer_model=corpus[0])
