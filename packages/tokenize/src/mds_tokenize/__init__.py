"""Tokenization of jsonl corpora into Megatron `.bin/.idx` datasets, and the tokenizer interface
every mds tool uses (README: "Python API").

`load_tokenizer(tokenizer_type=..., vocab_file=..., merge_file=..., tokenizer_name_or_path=...,
eod_token=...)` (or `load_tokenizer(TokenizerSpec(...))`) returns a `Tokenizer`: `.encode(text)`,
`.decode(ids)`, `.eod`, `.vocab_size`, `.description()`, for GPT-2 BPE files, a learned vocabulary
or a Hugging Face tokenizer.json. The names are imported on first use, so that the command line
starts (`--help`, `--version`) without loading numpy.
"""

from importlib import import_module
from typing import TYPE_CHECKING

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
        spec_from_description,
    )
    from mds_tokenize.tokenizer import GPT2BPETokenizer
    from mds_tokenize.vocab_files import TokenizerFileError

_EXPORTS = {
    "GPT2BPETokenizer": "mds_tokenize.tokenizer",
    "HFTokenizer": "mds_tokenize.hf_tokenizer",
    "TOKENIZER_TYPES": "mds_tokenize.interface",
    "Tokenizer": "mds_tokenize.interface",
    "TokenizerFlagError": "mds_tokenize.interface",
    "TokenizerSpec": "mds_tokenize.interface",
    "check_checkpoint_tokenizer": "mds_tokenize.interface",
    "check_dataset_tokenizer": "mds_tokenize.interface",
    "check_tokenizer_matches": "mds_tokenize.interface",
    "load_tokenizer": "mds_tokenize.interface",
    "spec_from_description": "mds_tokenize.interface",
    "TokenizerFileError": "mds_tokenize.vocab_files",
}
__all__ = [
    "GPT2BPETokenizer",
    "HFTokenizer",
    "TOKENIZER_TYPES",
    "Tokenizer",
    "TokenizerFileError",
    "TokenizerFlagError",
    "TokenizerSpec",
    "check_checkpoint_tokenizer",
    "check_dataset_tokenizer",
    "check_tokenizer_matches",
    "load_tokenizer",
    "spec_from_description",
]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
