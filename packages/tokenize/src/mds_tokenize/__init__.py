"""GPT-2 byte-level BPE tokenization of jsonl corpora into Megatron `.bin/.idx` datasets.

Public API for the other tools: `GPT2BPETokenizer.from_files(vocab_file, merge_file)` with
`.encode(text)`, `.decode(ids)`, `.eod`, `.vocab_size`.
"""

__version__ = "0.1.0"

from mds_tokenize.tokenizer import GPT2BPETokenizer  # noqa: E402 - after __version__, which it imports
from mds_tokenize.vocab_files import TokenizerFileError  # noqa: E402

__all__ = ["GPT2BPETokenizer", "TokenizerFileError", "__version__"]
