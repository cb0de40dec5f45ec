"""The encoder against its references: `regex.findall` for the pretokens (every code point) and
tiktoken, built from the same GPT-2 files, for the ids (both corpora and adversarial text)."""

import regex
from mds_tokenize.byte_level import GPT2_SPLIT_PATTERN

PATTERN = regex.compile(GPT2_SPLIT_PATTERN)


def test_ids_equal_tiktoken_on_both_corpora(gpt2_tokenizer, tiktoken_gpt2, corpus_texts):
    for name, texts in corpus_texts.items():
        ids, lengths = gpt2_tokenizer.encode_batch(texts)
        expected = tiktoken_gpt2.encode_ordinary_batch(texts, num_threads=1)
        assert lengths.tolist() == [len(doc) for doc in expected], name
        assert ids.tolist() == [token for doc in expected for token in doc], name
    # SOURCES.md: 1,215,181 tokens over the two corpora.
    assert (
        sum(len(gpt2_tokenizer.encode(text)) for texts in corpus_texts.values() for text in texts)
        == 1215181
    )


def test_ids_equal_tiktoken_on_adversarial_text(gpt2_tokenizer, tiktoken_gpt2, adversarial_texts):
    for text in adversarial_texts:
        assert gpt2_tokenizer.encode(text) == tiktoken_gpt2.encode_ordinary(text), repr(text[:200])


def test_pretokens_equal_regex_on_adversarial_text(gpt2_tokenizer, adversarial_texts):
    for text in adversarial_texts:
        assert gpt2_tokenizer.split(text) == PATTERN.findall(text), repr(text[:200])


def test_pretokens_equal_regex_around_every_code_point(gpt2_tokenizer):
    # Each code point next to a letter, a digit, an apostrophe, a space and a newline, so a wrong
    # class for any of them (letter/number/space/other) changes the split.
    every = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp < 0xE000]
    text = "".join(f"{char}'s{char}1 {char}a\n" for char in every)
    assert gpt2_tokenizer.split(text) == PATTERN.findall(text)
    runs = "".join(every)
    assert gpt2_tokenizer.split(runs) == PATTERN.findall(runs)


def test_whitespace_lookahead_cases(gpt2_tokenizer):
    cases = {
        "a   b": ["a", "  ", " b"],
        "a \n b": ["a", " \n", " b"],
        "a\n\nb": ["a", "\n", "\n", "b"],
        "a\tb": ["a", "\t", "b"],
        "end   ": ["end", "   "],
        "   ": ["   "],
        " 's 'S": [" '", "s", " '", "S"],
        "it's they'll I'M": ["it", "'s", " they", "'ll", " I", "'", "M"],
        "x!'s": ["x", "!'", "s"],
        "\u00a0\u00a0x": ["\u00a0", "\u00a0", "x"],
        "  1 2": [" ", " 1", " 2"],
    }
    for text, expected in cases.items():
        assert PATTERN.findall(text) == expected, text  # the cases themselves are right
        assert gpt2_tokenizer.split(text) == expected, text
