"""Fixtures of the mds-tokenize tests: tokenizers built from the shared GPT-2 files, a tiktoken
reference built from the same files (no download), corpora texts and seeded adversarial text."""

import json
import random

import pytest
from mds_tokenize import GPT2BPETokenizer
from mds_tokenize.byte_level import END_OF_TEXT, GPT2_SPLIT_PATTERN, unicode_to_bytes

WHITESPACE = [
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n ",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\u0085",
    "\x0b",
    "\x0c",
    " \t ",
    "\u200b",
]
CONTRACTIONS = [
    "'s",
    "'t",
    "'re",
    "'ve",
    "'m",
    "'ll",
    "'d",
    "'S",
    "'LL",
    "''",
    "'",
    "' s",
    "n't",
    "\u2019s",
]
PIECES = [
    "Hello",
    "world",
    "naïve",
    "İstanbul",
    "Ελληνικά",
    "русский",
    "עברית",
    "العربية",
    "हिन्दी",
    "ไทย",
    "中文字符",
    "日本語のテキスト",
    "한국어",
    "ᏣᎳᎩ",
    "𐌰𐌱𐌲",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "123",
    "٣٤٥",
    "１２３",
    "½",
    "Ⅻ",
    "²",
    "3.14",
    "1,000,000",
    "😀",
    "👩\u200d👩\u200d👧",
    "🏳\ufe0f\u200d🌈",
    "e\u0301",
    "a\u0308\u0323",
    "\u0300\u0301",
    "...",
    "!!!",
    END_OF_TEXT,
    "http://x.y/z?q=1&r=2",
    "a_b",
    "--",
    "\u200d",
    "\ufeff",
    "\x00",
    "\x7f",
    " " * 40,
    "\n" * 9,
    "a" * 300,
    "🙂" * 50,
]


def assigned_code_points() -> list[int]:
    """Code points assigned in Python's unicodedata (Unicode 14 on 3.11). tiktoken's Rust tables
    and the `regex` module (newer Unicode) disagree only on code points assigned later."""
    import unicodedata

    return [cp for cp in range(0x110000) if unicodedata.category(chr(cp)) not in ("Cn", "Cs")]


def adversarial_text(rng: random.Random, num_pieces: int, code_points: list[int]) -> str:
    """Tricky strings mixed with random code points of every plane, whitespace and contractions."""
    parts = []
    for _ in range(num_pieces):
        roll = rng.random()
        if roll < 0.25:
            parts.append(rng.choice(PIECES))
        elif roll < 0.45:
            parts.append(rng.choice(WHITESPACE))
        elif roll < 0.55:
            parts.append(rng.choice(CONTRACTIONS))
        else:
            parts.append(chr(rng.choice(code_points)) * rng.choice((1, 1, 1, 2, 5)))
    return "".join(parts)


@pytest.fixture(scope="session")
def adversarial_texts() -> list[str]:
    rng = random.Random(20261121)
    code_points = assigned_code_points()
    return [adversarial_text(rng, rng.randrange(1, 600), code_points) for _ in range(400)]


@pytest.fixture(scope="session")
def gpt2_args(shared_data) -> list:
    """GPT-2's vocabulary flags, as a command line gives them."""
    return [
        "--vocab-file",
        shared_data / "gpt2-vocab.json",
        "--merge-file",
        shared_data / "gpt2-merges.txt",
    ]


@pytest.fixture(scope="session")
def gpt2_tokenizer(shared_data) -> GPT2BPETokenizer:
    return GPT2BPETokenizer.from_files(
        shared_data / "gpt2-vocab.json", shared_data / "gpt2-merges.txt"
    )


@pytest.fixture(scope="session")
def tiny_tokenizer(shared_data) -> GPT2BPETokenizer:
    golden = shared_data / "megatron-golden"
    return GPT2BPETokenizer.from_files(
        golden / "gpt2-tiny-vocab.json", golden / "gpt2-tiny-merges.txt"
    )


@pytest.fixture(scope="session")
def tiktoken_gpt2(shared_data):
    """tiktoken's encoder from the same two files: token bytes via the byte-to-unicode inverse."""
    import tiktoken

    vocab = json.loads((shared_data / "gpt2-vocab.json").read_text(encoding="utf-8"))
    byte_of = unicode_to_bytes()
    ranks = {
        bytes(byte_of[char] for char in token): token_id
        for token, token_id in vocab.items()
        if token != END_OF_TEXT
    }
    return tiktoken.Encoding(
        "gpt2-from-shared-files",
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={END_OF_TEXT: vocab[END_OF_TEXT]},
    )


@pytest.fixture(scope="session")
def corpus_texts(shared_data) -> dict[str, list[str]]:
    texts = {}
    for name in ("openwebtext-1000.jsonl", "c4_demo.jsonl"):
        with open(shared_data / name, encoding="utf-8") as handle:
            texts[name] = [json.loads(line)["text"] for line in handle]
    return texts


# Hugging Face tokenizers built in the tests with the `tokenizers` library (no download).
WORDPIECE_VOCAB_SIZE = 70_000  # past uint16: the .bin holds int32


def gpt2_files_as_tokenizer_json(vocab_file, merge_file, folder):
    """GPT-2's vocab.json + merges.txt as a byte-level BPE tokenizer.json, built by `tokenizers`
    (ByteLevel without prefix space: GPT-2's pattern and byte map); `<|endoftext|>` stays a plain
    vocabulary entry, as in Megatron's GPT-2 tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
    lines = merge_file.read_text(encoding="utf-8").split("\n")[1:-1]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(line.split()) for line in lines]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="session")
def hf_gpt2_dir(shared_data, tmp_path_factory):
    return gpt2_files_as_tokenizer_json(
        shared_data / "gpt2-vocab.json",
        shared_data / "gpt2-merges.txt",
        tmp_path_factory.mktemp("hf-gpt2"),
    )


@pytest.fixture(scope="session")
def hf_tiny_dir(shared_data, tmp_path_factory):
    golden = shared_data / "megatron-golden"
    return gpt2_files_as_tokenizer_json(
        golden / "gpt2-tiny-vocab.json",
        golden / "gpt2-tiny-merges.txt",
        tmp_path_factory.mktemp("hf-tiny"),
    )


@pytest.fixture(scope="session")
def wordpiece_dir(corpus_texts, tmp_path_factory):
    """A WordPiece tokenizer trained here by `tokenizers` on both corpora, 70,000 entries; a BOS
    `<s>` is added by its post-processor; it has `[SEP]` but no end-of-text token."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=WORDPIECE_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=["[UNK]", "<s>", "[SEP]"],
        show_progress=False,
    )
    tokenizer.train_from_iterator(
        [text for texts in corpus_texts.values() for text in texts], trainer
    )
    assert tokenizer.get_vocab_size() == WORDPIECE_VOCAB_SIZE
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
    )
    folder = tmp_path_factory.mktemp("hf-wordpiece")
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder
