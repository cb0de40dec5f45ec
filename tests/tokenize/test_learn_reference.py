"""The fast learner (Cython, incremental pair counts, lazy heap) against a slow, obviously correct
one that recounts every pair before each merge: same merges in the same order, same vocabulary."""

import json
import random
from collections import Counter

import regex
from mds_tokenize.byte_level import END_OF_TEXT, GPT2_SPLIT_PATTERN, bytes_to_unicode
from mds_tokenize.learn.learner import learn_vocabulary


def reference_learn(words: Counter, *, vocab_size: int, special_tokens: tuple, min_frequency: int):
    """Textbook BPE: count all adjacent pairs (word count x occurrences), take the most frequent,
    ties to the smallest (left id, right id), merge it left to right in every word, repeat."""
    byte_to_char = bytes_to_unicode()
    strings = list(byte_to_char.values())
    ids = {string: token_id for token_id, string in enumerate(strings)}
    table = [[ids[byte_to_char[byte]] for byte in word.encode("utf-8")] for word in words]
    counts = list(words.values())
    missing_specials = sum(token not in ids for token in special_tokens)
    merges = []
    while len(strings) + missing_specials < vocab_size:
        pair_counts = Counter()
        for symbols, count in zip(table, counts, strict=True):
            for pair in zip(symbols, symbols[1:], strict=False):
                pair_counts[pair] += count
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        if pair_counts[best] < min_frequency:
            break
        new_string = strings[best[0]] + strings[best[1]]
        if new_string not in ids:
            ids[new_string] = len(strings)
            strings.append(new_string)
            missing_specials -= new_string in special_tokens
        merged = ids[new_string]
        for position, symbols in enumerate(table):
            rewritten, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    rewritten.append(merged)
                    i += 2
                else:
                    rewritten.append(symbols[i])
                    i += 1
            table[position] = rewritten
        merges.append((strings[best[0]], strings[best[1]]))
    vocab = dict(ids)
    for token in special_tokens:
        vocab.setdefault(token, len(vocab))
    return vocab, merges


def count(texts) -> Counter:
    find_words = regex.compile(GPT2_SPLIT_PATTERN).findall
    words = Counter()
    for text in texts:
        words.update(find_words(text))
    return words


def assert_same_as_reference(words, **options):
    fast_vocab, fast_merges = learn_vocabulary(words=words, **options)
    slow_vocab, slow_merges = reference_learn(words, **options)
    assert fast_merges == slow_merges
    assert fast_vocab == slow_vocab
    assert sorted(fast_vocab.values()) == list(range(len(fast_vocab)))
    return fast_vocab, fast_merges


def test_english_documents_match_reference(shared_data):
    with open(shared_data / "c4_demo.jsonl", encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for _, line in zip(range(12), lines, strict=False)]
    vocab, merges = assert_same_as_reference(
        count(texts), vocab_size=700, special_tokens=(END_OF_TEXT,), min_frequency=2
    )
    assert len(vocab) == 700 and vocab[END_OF_TEXT] == 699
    assert merges[0] == ("Ġ", "t")  # same first merge as GPT-2's own merges.txt


def test_tiny_alphabet_with_many_ties_and_repeated_symbols_matches_reference():
    # Two letters in random words: pair counts tie all the time and runs like "aaaa" overlap.
    rng = random.Random(5)
    texts = [
        " ".join("".join(rng.choice("ab") for _ in range(rng.randint(1, 9))) for _ in range(40))
        for _ in range(30)
    ]
    vocab, merges = assert_same_as_reference(
        count(texts), vocab_size=400, special_tokens=(END_OF_TEXT,), min_frequency=1
    )
    assert len(vocab) == 400 and ("a", "a") in merges


def test_multibyte_text_and_min_frequency_match_reference():
    texts = [
        "日本語のテキスト、日本語の文。",
        "emoji 🙂🙂 and ñandú, naïve café",
        "Ελληνικά κείμενα κείμενα",
        "tabs\tand\n\nnewlines   spaces",
        "'s 're 've 'll 123 4567 !!! ...",
    ] * 3
    assert_same_as_reference(
        count(texts), vocab_size=2000, special_tokens=(END_OF_TEXT,), min_frequency=3
    )


def test_exhausted_corpus_stops_early_like_reference():
    vocab, merges = assert_same_as_reference(
        count(["hello hello"]), vocab_size=1000, special_tokens=(END_OF_TEXT,), min_frequency=1
    )
    assert "Ġhello" in vocab and "hello" in vocab
    assert len(vocab) < 1000


def test_special_token_spelled_by_a_learned_token_shares_its_id():
    texts = ["ab ab ab abc abc"] * 5
    vocab, merges = assert_same_as_reference(
        count(texts), vocab_size=260, special_tokens=("ab", END_OF_TEXT), min_frequency=1
    )
    # "ab" is learned first and takes no extra id; merging goes on until 260 entries exist.
    assert merges == [("a", "b"), ("Ġ", "ab"), ("Ġab", "c")]
    assert (
        vocab["ab"] == 256
        and vocab["Ġabc"] == 258
        and vocab[END_OF_TEXT] == 259
        and len(vocab) == 260
    )


def test_byte_ids_follow_gpt2(shared_data):
    vocab, _ = learn_vocabulary(
        words=count(["x"]), vocab_size=300, special_tokens=(END_OF_TEXT,), min_frequency=1
    )
    gpt2 = json.loads((shared_data / "gpt2-vocab.json").read_text(encoding="utf-8"))
    assert {token: token_id for token, token_id in vocab.items() if token_id < 256} == {
        token: token_id for token, token_id in gpt2.items() if token_id < 256
    }


def hf_learn(texts, *, vocab_size: int, min_frequency: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=False,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    state = json.loads(tokenizer.to_str())["model"]
    return state["vocab"], [
        tuple(merge) if isinstance(merge, list) else tuple(merge.split(" "))
        for merge in state["merges"]
    ]


def test_same_merges_as_hugging_face_trainer(shared_data):
    # Our byte ids (GPT-2's order) are the byte symbols in code point order, which is how HF sorts
    # its alphabet, and HF also breaks count ties by the smaller id pair: the merges coincide.
    with open(shared_data / "c4_demo.jsonl", encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for line in lines]
    texts += ["日本語のテキスト、日本語の文。 🙂🙂 ñandú naïve café aaaa aaa aa"] * 5
    vocab, merges = learn_vocabulary(
        words=count(texts), vocab_size=3000, special_tokens=(END_OF_TEXT,), min_frequency=2
    )
    hf_vocab, hf_merges = hf_learn(texts, vocab_size=3000, min_frequency=2)
    assert merges == hf_merges
    assert set(vocab) == set(hf_vocab)
