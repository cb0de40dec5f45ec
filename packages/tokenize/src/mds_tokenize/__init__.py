"""GPT-2 byte-level BPE tokenization of jsonl corpora into Megatron `.bin/.idx` datasets."""

__version__ = "0.1.0"
