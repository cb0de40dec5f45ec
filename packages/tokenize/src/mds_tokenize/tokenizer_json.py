"""A GPT-2-format vocabulary (vocab.json + merges) as a Hugging Face `tokenizer.json`, written
without the `tokenizers` library: its byte-level BPE model, pre-tokenizer and decoder, set so that
`tokenizers` gives the ids of `GPT2BPETokenizer` (README: "tokenizer.json").

Special tokens stay plain vocabulary entries, not `added_tokens`: in Megatron's GPT-2 tokenizer the
text `<|endoftext|>` is ordinary characters, and an added token would be matched in the text.
Merges are written as "left right" strings, which every `tokenizers` version reads (byte-level
symbols never hold a space).
"""

import json

# ByteLevel with GPT-2's pattern (use_regex) and no prefix space: the split and byte-to-unicode map
# of byte_level.py.
_BYTE_LEVEL = {
    "type": "ByteLevel",
    "add_prefix_space": False,
    "trim_offsets": True,
    "use_regex": True,
}


def byte_level_bpe_json(vocab: dict[str, int], merges: list[tuple[str, str]]) -> str:
    """The tokenizer.json text of a byte-level BPE vocabulary (merges in rank order)."""
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": _BYTE_LEVEL,
        "post_processor": None,
        "decoder": _BYTE_LEVEL,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            # Words found whole in the vocab are still merged step by step, as GPT-2 does.
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{left} {right}" for left, right in merges],
        },
    }
    return json.dumps(document, ensure_ascii=False) + "\n"
