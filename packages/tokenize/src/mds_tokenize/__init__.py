"""GPT-2 byte-level BPE tokenization of jsonl corpora into Megatron `.bin/.idx` datasets.

Public API for the other tools: `GPT2BPETokenizer.from_files(vocab_file, merge_file)` with
`.encode(text)`, `.decode(ids)`, `.eod`, `.vocab_size`. The names are imported on first use, so
that the command line starts (`--help`, `--version`) without loading numpy.
"""

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mds_tokenize.tokenizer import GPT2BPETokenizer
    from mds_tokenize.vocab_files import TokenizerFileError

_EXPORTS = {
    "GPT2BPETokenizer": "mds_tokenize.tokenizer",
    "TokenizerFileError": "mds_tokenize.vocab_files",
}
__all__ = ["GPT2BPETokenizer", "TokenizerFileError"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
