"""GPT-2 byte-level BPE constants: the pretokenizer pattern and the byte-to-unicode alphabet.

Follows OpenAI's gpt-2 `encoder.py` (README: "GPT-2 byte-level BPE"); shared by the encoder
and the vocabulary learner so both see exactly the same words and symbols.
"""

from functools import cache

# Case-sensitive: "'S" is not a contraction. Applied with the third-party `regex` module (\p{..}).
GPT2_SPLIT_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)

END_OF_TEXT = "<|endoftext|>"


@cache
def bytes_to_unicode() -> dict[int, str]:
    """Byte value -> printable character: 188 printable bytes map to themselves, the other 68 (in
    increasing order) to U+0100, U+0101, ... so that no symbol is whitespace or a control char."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + shifted)
            shifted += 1
    return mapping


@cache
def unicode_to_bytes() -> dict[str, int]:
    return {char: byte for byte, char in bytes_to_unicode().items()}
