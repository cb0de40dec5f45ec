"""GPT-2 byte-level BPE tokenizer built from `vocab.json` + `merges.txt`: encode, decode, EOD.

Follows Megatron's `_GPT2BPETokenizer` (README: "GPT-2 byte-level BPE"): the GPT-2 pretokenizer
pattern, the byte-to-unicode map, merge ranks by line, unknown symbols -> id 0, `<|endoftext|>` as
EOD (never special inside text). The hot path is the Cython `BPECore`; this class interns symbols.
"""

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from mds_common.tokenizer_record import GPT2_BPE, TokenizerRecord

from mds_tokenize._bpe import BPECore
from mds_tokenize.byte_level import END_OF_TEXT, bytes_to_unicode, unicode_to_bytes
from mds_tokenize.unicode_classes import pattern_classes
from mds_tokenize.vocab_files import PairGaps, check_pair, load_merges, load_vocab


class GPT2BPETokenizer:
    """`encode(text) -> list[int]`, `decode(ids) -> str`, `eod`, `vocab_size` (unpadded)."""

    def __init__(
        self,
        *,
        vocab: dict[str, int],
        merges: Sequence[tuple[str, str]],
        cache_words: int = 1 << 18,
    ):
        self.vocab = dict(vocab)
        self.merges = [tuple(pair) for pair in merges]
        self.vocab_size = len(self.vocab)
        self._cache_words = cache_words
        # Megatron's BPE works on strings; interning them keeps "equal string" == "equal symbol".
        symbols = {token: index for index, token in enumerate(self.vocab)}
        lookup = symbols.get

        def intern(symbol: str) -> int:
            index = lookup(symbol)
            if index is None:
                index = symbols[symbol] = len(symbols)
            return index

        byte_chars = [char for _, char in sorted(bytes_to_unicode().items())]
        byte_positions = [lookup(char) for char in byte_chars]
        # Plain lookups first (almost every symbol is a vocab token), intern() only for the rest.
        lefts = [lookup(left) for left, _ in self.merges]
        rights = [lookup(right) for _, right in self.merges]
        products = [lookup(left + right) for left, right in self.merges]
        # Gaps between vocab and merges, from the lookups above: from_files refuses any, while the
        # constructor keeps Megatron's id 0 for them (the reference-equivalence tests rely on it).
        reachable = set(products)
        reachable.update(byte_positions)
        reachable.discard(None)
        self.pair_gaps = PairGaps(
            missing_byte_symbols=tuple(
                char
                for char, position in zip(byte_chars, byte_positions, strict=True)
                if position is None
            ),
            missing_merge_ranks=tuple(
                rank for rank, product in enumerate(products) if product is None
            ),
            num_unreachable=len(self.vocab) - len(reachable),
        )
        byte_symbols = [intern(char) for char in byte_chars]
        for index, (left, right) in enumerate(self.merges):
            if lefts[index] is None or rights[index] is None or products[index] is None:
                lefts[index], rights[index] = intern(left), intern(right)
                products[index] = intern(left + right)
        # Symbols missing from the vocab map to id 0, as Megatron's `encoder.get(token, 0)`; never
        # the case with the real GPT-2 files, possible with a hand-trimmed vocab.
        symbol_ids = list(self.vocab.values())
        symbol_ids.extend([0] * (len(symbols) - len(symbol_ids)))
        self._core = BPECore(
            classes=pattern_classes(),
            byte_symbols=byte_symbols,
            symbol_ids=symbol_ids,
            merges=list(zip(lefts, rights, products, strict=True)),
            cache_words=cache_words,
        )
        self.max_token_id = max(self.vocab.values())
        self._token_bytes: list[bytes | None] | None = None  # built by the first decode
        self._files: tuple[Path, ...] = ()  # set by from_files

    @classmethod
    def from_files(
        cls, vocab_file: str | Path, merge_file: str | Path, **kwargs
    ) -> "GPT2BPETokenizer":
        """Raises TokenizerFileError (a ValueError naming the file) for a missing or bad file, or
        for a vocab and merges file that do not belong together."""
        tokenizer = cls(vocab=load_vocab(vocab_file), merges=load_merges(merge_file), **kwargs)
        check_pair(
            tokenizer.pair_gaps,
            vocab=tokenizer.vocab,
            merges=tokenizer.merges,
            vocab_file=vocab_file,
            merge_file=merge_file,
        )
        tokenizer._files = (Path(vocab_file), Path(merge_file))
        return tokenizer

    def __reduce__(self):
        return (_rebuild, (self.vocab, self.merges, self._cache_words, self._files))

    @property
    def files(self) -> tuple[Path, ...]:
        """(vocab_file, merge_file) when built by from_files, else ()."""
        return self._files

    def record(self) -> TokenizerRecord:
        """What sidecars and checkpoints record (`mds_tokenize.interface`): the files' absolute
        paths and SHA-256 (so a copy elsewhere is the same vocabulary), size and EOD."""
        fields = dict(
            vocab_size=self.vocab_size,
            eod_id=self.vocab.get(END_OF_TEXT),
            max_token_id=self.max_token_id,
        )
        if self._files:
            return TokenizerRecord.of_files(GPT2_BPE, self._files, **fields)
        return TokenizerRecord.of(type=GPT2_BPE, **fields)

    @property
    def eod(self) -> int:
        if END_OF_TEXT not in self.vocab:
            where = self._files[0] if self._files else "the vocabulary"
            raise ValueError(f"{where} has no {END_OF_TEXT} token to use as end of document")
        return self.vocab[END_OF_TEXT]

    @property
    def has_eod(self) -> bool:
        return END_OF_TEXT in self.vocab

    def encode_batch(
        self, texts: list[str], *, append_eod: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids as uint32 back to back, lengths as int64). A text with a lone surrogate gets length
        -1 and contributes nothing; an empty result gets length 0 and no EOD (Megatron skips it)."""
        eod = self.eod if append_eod else 0
        return self._core.encode_batch(texts, append_eod=append_eod, eod=eod)

    def encode_array(self, text: str) -> np.ndarray:
        ids, lengths = self._core.encode_batch([text])
        if lengths[0] < 0:
            raise ValueError(
                "text contains a lone surrogate (U+D800..U+DFFF), which has no UTF-8 encoding"
            )
        return ids

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def split(self, text: str) -> list[str]:
        """The pretokens, equal to `regex.findall(GPT2_SPLIT_PATTERN, text)`."""
        return self._core.split(text)

    def _decode_table(self) -> list[bytes | None]:
        if self._token_bytes is None:
            to_latin1 = str.maketrans(
                {char: chr(byte) for byte, char in bytes_to_unicode().items()}
            )
            table: list[bytes | None] = [None] * (self.max_token_id + 1)
            for token, token_id in self.vocab.items():
                try:
                    table[token_id] = token.translate(to_latin1).encode("latin-1")
                except UnicodeEncodeError:
                    # Characters outside the byte alphabet (non-GPT-2 vocabs only) decode as UTF-8.
                    byte_of = unicode_to_bytes()
                    table[token_id] = b"".join(
                        bytes([byte_of[char]])
                        if char in byte_of
                        else char.encode("utf-8", "surrogatepass")
                        for char in token
                    )
            self._token_bytes = table
        return self._token_bytes

    def token_bytes(self, token_id: int) -> bytes:
        table = self._decode_table()
        if not 0 <= token_id <= self.max_token_id or table[token_id] is None:
            raise ValueError(
                f"token id {token_id} is not in the vocabulary (ids 0..{self.max_token_id})"
            )
        return table[token_id]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        table = self._decode_table()
        try:
            pieces = [table[token_id] for token_id in ids]
        except (IndexError, TypeError):
            pieces = None
        if pieces is None or None in pieces:
            for token_id in ids:
                self.token_bytes(int(token_id))  # raises for the first unknown id
        return b"".join(pieces)

    def decode(self, ids: Iterable[int]) -> str:
        """Megatron's decode: token bytes concatenated, invalid UTF-8 replaced with U+FFFD."""
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def _rebuild(
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    cache_words: int,
    files: tuple[Path, ...] = (),
) -> GPT2BPETokenizer:
    tokenizer = GPT2BPETokenizer(vocab=vocab, merges=merges, cache_words=cache_words)
    tokenizer._files = files
    return tokenizer
