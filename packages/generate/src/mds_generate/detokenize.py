"""WikiText's word-level tokenization undone, with the rules and order of Megatron's
`tasks/zeroshot_gpt/detokenizer.py` (`wikitext_detokenizer`), before GPT-2 BPE sees the text.
"""

from __future__ import annotations

import re

_REPLACEMENTS_BEFORE = (
    ("s '", "s'"),
    (" @-@ ", "-"),
    (" @,@ ", ","),
    (" @.@ ", "."),
    (" : ", ": "),
    (" ; ", "; "),
    (" . ", ". "),
    (" ! ", "! "),
    (" ? ", "? "),
    (" , ", ", "),
)
# Spaces just inside bracket and quote pairs, non-greedy per kind.
_PAIRS = (
    (re.compile(r"\(\s*([^\)]*?)\s*\)"), r"(\1)"),
    (re.compile(r"\[\s*([^\]]*?)\s*\]"), r"[\1]"),
    (re.compile(r"{\s*([^}]*?)\s*}"), r"{\1}"),
    (re.compile(r"\"\s*([^\"]*?)\s*\""), r'"\1"'),
    (re.compile(r"'\s*([^']*?)\s*'"), r"'\1'"),
)
_REPLACEMENTS_AFTER = (
    ("= = = =", "===="),
    ("= = =", "==="),
    ("= =", "=="),
    (" \u00b0 ", "\u00b0"),
    (" \n", "\n"),
    ("\n ", "\n"),
    (" N ", " 1 "),
    (" 's", "'s"),
)


def wikitext_detokenize(text: str) -> str:
    for old, new in _REPLACEMENTS_BEFORE:
        text = text.replace(old, new)
    for pattern, replacement in _PAIRS:
        text = pattern.sub(replacement, text)
    for old, new in _REPLACEMENTS_AFTER:
        text = text.replace(old, new)
    return text
