"""The tokenizer flags, declared once for every mds tool that reads or writes token ids
(mds_common.flags): `--tokenizer-type`, `--vocab-file`/`--merge-file` (GPT-2 BPE),
`--tokenizer-name-or-path` (a Hugging Face tokenizer.json) and `--eod-token`, or upstream's
`--tokenizer-model` (SentencePieceTokenizer, GPTSentencePieceTokenizer, HFTokenizer). A tool's
config inherits `TokenizerFlags`, and its command checks the flags with `tokenizer_spec` (a usage
error, exit 2, as for a missing flag):

    @dataclass(frozen=True, kw_only=True)
    class DataSection(TokenizerFlags):
        ...
    tokenizer = load_tokenizer(tokenizer_spec(config.data))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import typer
from mds_common.flags import flag

from mds_tokenize.interface import (
    GPT2_BPE,
    PRETRAINED_FROM_HF,
    TokenizerFlagError,
    TokenizerSpec,
)


@dataclass(frozen=True, kw_only=True)
class TokenizerFlags:
    # A plain string, not choices: a Megatron type we lack (BertWordPieceLowerCase, ...) gets
    # TokenizerSpec's message, which says what to use instead.
    tokenizer_type: str | None = flag(
        "--tokenizer-type",
        default=GPT2_BPE,
        help="GPT2BPETokenizer (--vocab-file, --merge-file: GPT-2's or a learned pair), "
        "PretrainedFromHF (--tokenizer-name-or-path: any Hugging Face tokenizer.json), or "
        "upstream's SentencePieceTokenizer, GPTSentencePieceTokenizer (--tokenizer-model: a "
        "SentencePiece model) and HFTokenizer (--tokenizer-model: a tokenizer.json).",
    )
    vocab_file: Path | None = flag(
        "--vocab-file", "--vocab", help="GPT-2 vocab.json (token -> id)."
    )
    merge_file: Path | None = flag(
        "--merge-file", help="GPT-2 merges.txt ('#version' header, one pair per line)."
    )
    tokenizer_name_or_path: str | None = flag(
        "--tokenizer-name-or-path",
        help="PretrainedFromHF: a folder holding tokenizer.json, the file itself, or a hub name "
        "(hub names need transformers and the network).",
    )
    eod_token: str | None = flag(
        "--eod-token",
        help="PretrainedFromHF: the token that ends documents [default: the eos token of "
        "tokenizer_config.json, else <|endoftext|>, </s>, <|end_of_text|> or <eos>].",
    )
    tokenizer_model: str | None = flag(
        "--tokenizer-model",
        help="SentencePieceTokenizer, GPTSentencePieceTokenizer: the SentencePiece model "
        "(tokenizer.model); HFTokenizer: a folder holding tokenizer.json, the file, or a hub name.",
    )

    @property
    def names_files(self) -> bool:
        """Whether any flag but the type was given (a tokenizer to load, not the default's)."""
        return any(
            value is not None
            for value in (
                self.vocab_file,
                self.merge_file,
                self.tokenizer_name_or_path,
                self.eod_token,
                self.tokenizer_model,
            )
        )

    def spec(self) -> TokenizerSpec:
        """The validated flags (TokenizerFlagError, a ValueError, names the flag to fix)."""
        return TokenizerSpec(
            tokenizer_type=self.tokenizer_type,
            vocab_file=self.vocab_file,
            merge_file=self.merge_file,
            tokenizer_name_or_path=self.tokenizer_name_or_path,
            eod_token=self.eod_token,
            tokenizer_model=self.tokenizer_model,
        )


class TokenizerFlagUsage(typer.BadParameter):
    """A tokenizer flag missing or misplaced: exit 2, the message as is (no "Invalid value")."""

    def format_message(self) -> str:
        return self.message


def tokenizer_spec(flags: TokenizerFlags) -> TokenizerSpec:
    """The command line's tokenizer; a missing or misplaced flag is a usage error (exit 2)."""
    try:
        return flags.spec()
    except TokenizerFlagError as error:
        raise TokenizerFlagUsage(str(error)) from None


def named_tokenizer_spec(flags: TokenizerFlags) -> TokenizerSpec:
    """`tokenizer_spec` for a tool whose --tokenizer-type has no default (the checkpoint's or
    folder's own tokenizer stands unless files are named), flags naming files: without a type,
    --tokenizer-name-or-path means PretrainedFromHF, --vocab-file/--merge-file GPT-2 BPE, and a
    lone --tokenizer-model is the usage error that says upstream's flag needs its type named."""
    kind = flags.tokenizer_type
    if kind is None:
        if flags.tokenizer_model is not None:
            tokenizer_spec(dataclasses.replace(flags, tokenizer_type=GPT2_BPE))
        kind = GPT2_BPE if flags.tokenizer_name_or_path is None else PRETRAINED_FROM_HF
    return tokenizer_spec(dataclasses.replace(flags, tokenizer_type=kind))


__all__ = ["GPT2_BPE", "TokenizerFlags", "named_tokenizer_spec", "tokenizer_spec"]
