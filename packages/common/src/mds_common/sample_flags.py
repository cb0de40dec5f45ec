"""`--seq-length`, declared once (mds_common.flags) for the two packages that own it and do not
depend on each other: the GPT's context (`mds_model.flags.GPTFlags`) and the sample-index caches'
sample length (`mds_indexed_data.flags`). Megatron has one argument for both."""

from __future__ import annotations

from dataclasses import dataclass

from mds_common.flags import flag


@dataclass(frozen=True, kw_only=True)
class SeqLengthFlags:
    seq_length: int | None = flag("--seq-length", help="Tokens per sample.")
