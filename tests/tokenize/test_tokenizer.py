"""GPT2BPETokenizer: known vectors, decode, EOD, unknown symbols, and the merge loop against a
plain-Python transcription of Megatron's `bpe()` on hand-made vocabularies."""

import pickle
import random

import numpy as np
import pytest
import regex
from mds_tokenize import GPT2BPETokenizer
from mds_tokenize.byte_level import GPT2_SPLIT_PATTERN, bytes_to_unicode


def megatron_encode(text: str, vocab: dict[str, int], merges: list[tuple[str, str]]) -> list[int]:
    """Reference: gpt2_tokenization.py's encode, no cache (README: "GPT-2 byte-level BPE")."""
    ranks = {pair: rank for rank, pair in enumerate(merges)}
    byte_encoder = bytes_to_unicode()
    ids = []
    for piece in regex.findall(GPT2_SPLIT_PATTERN, text):
        word = tuple(byte_encoder[byte] for byte in piece.encode("utf-8"))
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            bigram = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
            if bigram not in ranks:
                break
            first, second = bigram
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        ids.extend(vocab.get(symbol, 0) for symbol in word)
    return ids


def test_known_vectors(gpt2_tokenizer):
    assert gpt2_tokenizer.encode("Hello world!") == [15496, 995, 0]
    # The literal "<|endoftext|>" in text is ordinary characters (README: "GPT-2 byte-level BPE").
    assert gpt2_tokenizer.encode("Hello world! <|endoftext|> It's 2024.") == [
        15496,
        995,
        0,
        1279,
        91,
        437,
        1659,
        5239,
        91,
        29,
        632,
        338,
        48609,
        13,
    ]
    assert gpt2_tokenizer.eod == 50256
    assert gpt2_tokenizer.vocab_size == 50257
    assert gpt2_tokenizer.encode("") == []


def test_tiny_vocab_eod(tiny_tokenizer):
    assert tiny_tokenizer.eod == 4999
    assert tiny_tokenizer.vocab_size == 5000


def test_decode_round_trips(gpt2_tokenizer, adversarial_texts, corpus_texts):
    for text in adversarial_texts + corpus_texts["c4_demo.jsonl"][:50]:
        assert gpt2_tokenizer.decode(gpt2_tokenizer.encode(text)) == text
    assert gpt2_tokenizer.decode(np.array([15496, 995, 0], dtype=np.uint16)) == "Hello world!"


def test_decode_partial_utf8_replaced(gpt2_tokenizer):
    ids = gpt2_tokenizer.encode("😀")
    assert len(ids) > 1
    assert gpt2_tokenizer.decode(ids[:1]) == "\ufffd"
    assert (
        gpt2_tokenizer.token_bytes(ids[0])
        == "😀".encode()[: len(gpt2_tokenizer.token_bytes(ids[0]))]
    )


def test_decode_unknown_id_is_an_error(gpt2_tokenizer):
    with pytest.raises(ValueError, match="token id 50257 is not in the vocabulary"):
        gpt2_tokenizer.decode([1, 50257])


def test_lone_surrogate_is_an_error(gpt2_tokenizer):
    with pytest.raises(ValueError, match="lone surrogate"):
        gpt2_tokenizer.encode("ok \ud800 no")
    ids, lengths = gpt2_tokenizer.encode_batch(["a", "b\udc00", "c"])
    assert lengths.tolist() == [1, -1, 1]
    assert ids.tolist() == gpt2_tokenizer.encode("a") + gpt2_tokenizer.encode("c")


def test_encode_batch_eod_only_after_non_empty(gpt2_tokenizer):
    ids, lengths = gpt2_tokenizer.encode_batch(["Hello", "", "world!"], append_eod=True)
    assert lengths.tolist() == [2, 0, 3]
    assert ids.tolist() == [15496, 50256, 6894, 0, 50256]


def test_pickle_round_trip(tiny_tokenizer):
    clone = pickle.loads(pickle.dumps(tiny_tokenizer))
    text = "Pickled tokenizers encode the same."
    assert clone.encode(text) == tiny_tokenizer.encode(text)


def test_cache_does_not_change_results(gpt2_tokenizer, shared_data):
    small_cache = GPT2BPETokenizer.from_files(
        shared_data / "gpt2-vocab.json", shared_data / "gpt2-merges.txt", cache_words=4
    )
    text = " ".join(["repeat", "words", "again", "and", "again", "unusualword"] * 50)
    assert small_cache.encode(text) == gpt2_tokenizer.encode(text)
    assert small_cache.encode(text) == gpt2_tokenizer.encode(text)


def _byte_vocab() -> dict[str, int]:
    return {char: byte for byte, char in bytes_to_unicode().items()}


def test_merge_loop_matches_megatron_on_tricky_merges():
    vocab = _byte_vocab()
    # Repeated pairs, a later duplicate rank, a merge whose result is not in the vocab (-> id 0),
    # and a low-ranked merge that only becomes possible after a higher-ranked one.
    merges = [
        ("b", "c"),
        ("a", "a"),
        ("aa", "a"),
        ("a", "bc"),
        ("x", "y"),
        ("aa", "aa"),
        ("a", "a"),
    ]
    for token in ("bc", "aa", "aaa", "abc", "aaaa"):
        vocab[token] = len(vocab)
    tokenizer = GPT2BPETokenizer(vocab=vocab, merges=merges)
    for text in ("aaaaaaa", "abcabc aaaa", "xy", "abcbcaaa", "a", "bcbcbc", "aaaaa bc"):
        assert tokenizer.encode(text) == megatron_encode(text, vocab, merges), text
    assert 0 in tokenizer.encode("xy")  # "xy" is not in the vocab: Megatron's id 0


def test_merge_loop_matches_megatron_on_random_merges():
    rng = random.Random(7)
    vocab = _byte_vocab()
    alphabet = "abcde"
    symbols = list(alphabet)
    merges = []
    for _ in range(60):
        left, right = rng.choice(symbols), rng.choice(symbols)
        merges.append((left, right))
        if left + right not in symbols and len(left + right) < 6:
            symbols.append(left + right)
            if rng.random() < 0.8:
                vocab[left + right] = len(vocab)
    tokenizer = GPT2BPETokenizer(vocab=vocab, merges=merges)
    # Words of 128+ bytes take the heap merge loop, shorter ones the rescanning loop.
    for length in (130, 200, 1000):
        text = "".join(rng.choice(alphabet[: rng.randrange(1, 6)]) for _ in range(length))
        assert tokenizer.encode(text) == megatron_encode(text, vocab, merges), text
    for _ in range(300):
        text = " ".join(
            "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 25))) for _ in range(3)
        )
        assert tokenizer.encode(text) == megatron_encode(text, vocab, merges), text


def test_long_words(gpt2_tokenizer, tiktoken_gpt2):
    rng = random.Random(3)
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGH") for _ in range(20000))
    texts = ["a" * 5000, " " * 3000 + "x", "\U0001f600" * 700, "ab" * 2000, "1" * 999, letters]
    texts += [letters[:length] for length in (126, 127, 128, 129, 300)]
    for text in texts:
        assert gpt2_tokenizer.encode(text) == tiktoken_gpt2.encode_ordinary(text), len(text)
