"""Class of every code point under the GPT-2 pretokenizer pattern: letter (\\p{L}), number (\\p{N}),
whitespace (\\s) or other, read from the installed `regex` module.

Deriving the table from `regex` itself (not `unicodedata`, whose Unicode version can differ) keeps
the Cython scan in `_bpe.pyx` identical to `regex.findall(GPT2_SPLIT_PATTERN, text)`.
"""

from functools import cache

import numpy as np
import regex

CLASS_OTHER = 0
CLASS_LETTER = 1
CLASS_NUMBER = 2
CLASS_SPACE = 3

NUM_CODE_POINTS = 0x110000


@cache
def pattern_classes() -> bytes:
    """One class byte per code point (0x110000 bytes). About 0.1 s, once per process."""
    table = bytearray(NUM_CODE_POINTS)
    # 20x faster than "".join(map(chr, ...)); surrogatepass keeps U+D800..U+DFFF (class "other").
    every_code_point = (
        np.arange(NUM_CODE_POINTS, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
    )
    for class_code, pattern in (
        (CLASS_LETTER, r"\p{L}+"),
        (CLASS_NUMBER, r"\p{N}+"),
        (CLASS_SPACE, r"\s+"),
    ):
        fill = bytes([class_code])
        for match in regex.finditer(pattern, every_code_point):
            start, end = match.span()
            assert not any(table[start:end]), f"{pattern} overlaps another class at U+{start:04X}"
            table[start:end] = fill * (end - start)
    return bytes(table)
