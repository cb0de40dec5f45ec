"""Tokenization of jsonl corpora into Megatron `.bin/.idx` datasets, and the tokenizer interface
every mds tool uses (README: "Python API").

`load_tokenizer(tokenizer_type=..., vocab_file=..., merge_file=..., tokenizer_name_or_path=...,
eod_token=...)` (or `load_tokenizer(TokenizerSpec(...))`) returns a `Tokenizer`: `.encode(text)`,
`.decode(ids)`, `.eod`, `.vocab_size`, `.record()`, for GPT-2 BPE files, a learned vocabulary,
a Hugging Face tokenizer.json or a SentencePiece model. The names are imported on first use, so
that the command line starts (`--help`, `--version`) without loading numpy.
"""

from typing import TYPE_CHECKING

from mds_common.lazy import lazy_attributes

if TYPE_CHECKING:
    from mds_tokenize.hf_tokenizer import HFTokenizer
    from mds_tokenize.interface import (
        TOKENIZER_TYPES,
        Tokenizer,
        TokenizerFlagError,
        TokenizerSpec,
        check_checkpoint_tokenizer,
        check_dataset_tokenizer,
        check_tokenizer_matches,
        load_tokenizer,
        spec_from_record,
    )
    from mds_tokenize.sentencepiece_tokenizer import SentencePieceTokenizer
    from mds_tokenize.tokenizer import GPT2BPETokenizer
    from mds_tokenize.vocab_files import TokenizerFileError

_MODULE_OF = {
    "GPT2BPETokenizer": "tokenizer",
    "HFTokenizer": "hf_tokenizer",
    "SentencePieceTokenizer": "sentencepiece_tokenizer",
    "TOKENIZER_TYPES": "interface",
    "Tokenizer": "interface",
    "TokenizerFlagError": "interface",
    "TokenizerSpec": "interface",
    "check_checkpoint_tokenizer": "interface",
    "check_dataset_tokenizer": "interface",
    "check_tokenizer_matches": "interface",
    "load_tokenizer": "interface",
    "spec_from_record": "interface",
    "TokenizerFileError": "vocab_files",
}
__all__ = [
    "GPT2BPETokenizer",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "TOKENIZER_TYPES",
    "Tokenizer",
    "TokenizerFileError",
    "TokenizerFlagError",
    "TokenizerSpec",
    "check_checkpoint_tokenizer",
    "check_dataset_tokenizer",
    "check_tokenizer_matches",
    "load_tokenizer",
    "spec_from_record",
]


__getattr__, __dir__ = lazy_attributes(__name__, _MODULE_OF)
