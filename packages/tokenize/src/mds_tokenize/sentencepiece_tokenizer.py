"""`--tokenizer-type SentencePieceTokenizer|GPTSentencePieceTokenizer --tokenizer-model FILE`: a
SentencePiece model (Llama 2's `tokenizer.model`), run by the `sentencepiece` library, exactly as
deepspeedai/Megatron-DeepSpeed 6acc370a's `_SentencePieceTokenizer` and `_GPTSentencePieceTokenizer`
(megatron/tokenizer/tokenizer.py; README: "SentencePiece tokenizers").

GPTSentencePieceTokenizer: ids are `encode_as_ids(text)`, EOD is the model's eos id, the vocabulary
is the model's pieces. SentencePieceTokenizer adds the specials `<CLS> <SEP> <EOD> <MASK>` and the
pad, bos and eos pieces (`<PAD>`, `<BOS>`, `<EOS>` where the model has none) after the pieces they
are not already, cuts text at every occurrence of a special's text (encoding the pieces between
separately), and ends documents with `<EOD>`.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from mds_common.tokenizer_record import GPT_SENTENCEPIECE, SENTENCEPIECE, TokenizerRecord

from mds_tokenize.interface import pack_id_lists

MODEL_FLAG = "--tokenizer-model"


def import_sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise ValueError(
            "SentencePiece tokenizers need the sentencepiece library, which is not installed: "
            "pip install sentencepiece"
        ) from None
    return sentencepiece


class SentencePieceTokenizer:
    """The `Tokenizer` interface over a SentencePiece model; `kind` is upstream's type name.
    Build with `from_file`."""

    def __init__(self, model: bytes, *, kind: str, model_file: Path):
        if kind not in (SENTENCEPIECE, GPT_SENTENCEPIECE):
            raise ValueError(f"not a SentencePiece tokenizer type: {kind}")
        sentencepiece = import_sentencepiece()
        self.kind = kind
        self.model_file = model_file
        self._model = model
        try:
            self._processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        except Exception as error:  # sentencepiece raises RuntimeError with a C++ status text
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ValueError(
                f"{MODEL_FLAG} {model_file}: not a SentencePiece model ({reason}); pass the "
                "tokenizer.model file sentencepiece wrote"
            ) from None
        processor = self._processor
        # upstream's _populate_vocab: piece -> id and id -> piece over the model's ids
        self._vocab = {processor.id_to_piece(i): i for i in range(len(processor))}
        self._pieces = {i: piece for piece, i in self._vocab.items()}
        self._specials: dict[str, int] = {}
        if kind == SENTENCEPIECE:
            self._add_specials()
            self._eod_id = self._specials["<EOD>"]
            # The earliest special's text in the rest of the text wins; at one position the one
            # added first (upstream's min over its dict): a regex alternation in that order.
            self._split = re.compile("|".join(re.escape(token) for token in self._specials))
            self._special_ids = {i: token for token, i in self._specials.items()}
        else:
            eos = processor.eos_id()
            self._eod_id = eos if eos >= 0 else None
        # upstream's vocab_size: len(self._vocab), the pieces and the added specials
        self.vocab_size = len(self._vocab)
        self.max_token_id = max([len(processor) - 1, *self._specials.values()])

    def _add_specials(self) -> None:
        processor = self._processor

        def piece(token_id: int, missing: str) -> str:
            try:
                return processor.id_to_piece(token_id)
            except IndexError:  # -1: the model has none
                return missing

        tokens = ["<CLS>", "<SEP>", "<EOD>", "<MASK>"]
        tokens += [piece(processor.pad_id(), "<PAD>"), piece(processor.bos_id(), "<BOS>")]
        tokens.append(piece(processor.eos_id(), "<EOS>"))
        for token in tokens:
            if token not in self._vocab:
                self._vocab[token] = len(self._vocab)
                self._pieces[self._vocab[token]] = token
            self._specials[token] = self._vocab[token]

    @classmethod
    def from_file(cls, model_file: str | Path, *, kind: str) -> SentencePieceTokenizer:
        path = Path(model_file).expanduser()
        if not path.is_file():
            raise ValueError(
                f"{MODEL_FLAG} {model_file}: no such file; pass the SentencePiece model "
                "(tokenizer.model)"
            )
        return cls(path.read_bytes(), kind=kind, model_file=path.resolve())

    def __reduce__(self):
        return (_rebuild, (self._model, self.kind, self.model_file))

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.model_file,)

    @property
    def has_eod(self) -> bool:
        return self._eod_id is not None

    @property
    def eod(self) -> int:
        if self._eod_id is None:
            raise ValueError(
                f"{self.model_file} has no eos piece (eos_id -1), which {GPT_SENTENCEPIECE} ends "
                f"documents with; use --tokenizer-type {SENTENCEPIECE} (its <EOD>) or a model "
                "trained with an eos piece"
            )
        return self._eod_id

    def encode(self, text: str) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                "text contains a lone surrogate (U+D800..U+DFFF), which has no UTF-8 encoding"
            ) from None
        if self.kind == GPT_SENTENCEPIECE:
            return self._processor.encode_as_ids(text)
        ids: list[int] = []
        start = 0
        for match in self._split.finditer(text):
            ids += self._processor.encode_as_ids(text[start : match.start()])
            ids.append(self._specials[match.group()])
            start = match.end()
        ids += self._processor.encode_as_ids(text[start:])
        return ids

    def encode_batch(
        self, texts: list[str], *, append_eod: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids as uint32 back to back, lengths as int64), as GPT2BPETokenizer.encode_batch."""
        if self.kind == GPT_SENTENCEPIECE:
            for text in texts:
                self.encode(text)  # a lone surrogate: the one-line error, not sentencepiece's
            id_lists = self._processor.encode_as_ids(texts)
        else:
            id_lists = [self.encode(text) for text in texts]
        return pack_id_lists(id_lists, eod=self.eod if append_eod else None)

    def decode(self, ids) -> str:
        """Upstream's detokenize: `decode_ids`; SentencePieceTokenizer writes each special as
        its text with a space on each side of it, the pieces between decoded apart."""
        ids = ids.tolist() if isinstance(ids, np.ndarray) else [int(token) for token in ids]
        for token in ids:
            if not 0 <= token <= self.max_token_id:
                raise ValueError(
                    f"token id {token} is not in the vocabulary (ids 0..{self.max_token_id})"
                )
        if self.kind == GPT_SENTENCEPIECE:
            return self._processor.decode_ids(ids)
        text, last = "", 0
        for position, token in enumerate(ids):
            if token in self._special_ids:
                text += self._processor.decode_ids(ids[last:position]) + " "
                text += self._special_ids[token] + " "
                last = position + 1
        return text + self._processor.decode_ids(ids[last:])

    def record(self) -> TokenizerRecord:
        return TokenizerRecord.of_files(
            self.kind,
            [self.model_file],
            vocab_size=self.vocab_size,
            eod_id=self._eod_id,
            max_token_id=self.max_token_id,
        )


def _rebuild(model: bytes, kind: str, model_file: Path) -> SentencePieceTokenizer:
    return SentencePieceTokenizer(model, kind=kind, model_file=model_file)
