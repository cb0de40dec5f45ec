"""GPT-2 byte-level BPE tokenization of jsonl corpora into Megatron `.bin/.idx` datasets.

Public API for the other tools: `GPT2BPETokenizer.from_files(vocab_file, merge_file)` with
`.encode(text)`, `.decode(ids)`, `.eod`, `.vocab_size`.
"""

from mds_tokenize.tokenizer import GPT2BPETokenizer
from mds_tokenize.vocab_files import TokenizerFileError

__all__ = ["GPT2BPETokenizer", "TokenizerFileError"]
