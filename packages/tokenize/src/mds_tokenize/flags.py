"""The tokenizer flags as typer options, for every command that reads or writes token ids:
`--tokenizer-type`, `--vocab-file`/`--merge-file` (GPT-2 BPE) or `--tokenizer-name-or-path`
(a Hugging Face tokenizer.json) and `--eod-token`. Another tool declares the same five parameters
with these annotations and passes them to `tokenizer_spec`:

    def generate(..., tokenizer_type: TokenizerType = GPT2_BPE, vocab_file: VocabFile = None,
                 merge_file: MergeFile = None, tokenizer_name_or_path: TokenizerNameOrPath = None,
                 eod_token: EodToken = None):
        tokenizer = load_tokenizer(tokenizer_spec(tokenizer_type, vocab_file, merge_file,
                                                  tokenizer_name_or_path, eod_token))
"""

from pathlib import Path
from typing import Annotated

import typer

from mds_tokenize.interface import GPT2_BPE, TokenizerFlagError, TokenizerSpec

# A plain string, so that a Megatron type we lack (BertWordPieceLowerCase, ...) gets
# TokenizerSpec's message, which says what to use instead.
TokenizerType = Annotated[
    str,
    typer.Option(
        "--tokenizer-type",
        help="GPT2BPETokenizer (--vocab-file, --merge-file: GPT-2's or a learned pair) or "
        "PretrainedFromHF (--tokenizer-name-or-path: any Hugging Face tokenizer.json).",
    ),
]
VocabFile = Annotated[
    Path | None,
    typer.Option("--vocab-file", "--vocab", help="GPT-2 vocab.json (token -> id)."),
]
MergeFile = Annotated[
    Path | None,
    typer.Option("--merge-file", help="GPT-2 merges.txt ('#version' header, one pair per line)."),
]
TokenizerNameOrPath = Annotated[
    str | None,
    typer.Option(
        "--tokenizer-name-or-path",
        help="PretrainedFromHF: a folder holding tokenizer.json, the file itself, or a hub name "
        "(hub names need transformers and the network).",
    ),
]
EodToken = Annotated[
    str | None,
    typer.Option(
        "--eod-token",
        help="PretrainedFromHF: the token that ends documents [default: the eos token of "
        "tokenizer_config.json, else <|endoftext|>, </s>, <|end_of_text|> or <eos>].",
    ),
]


class TokenizerFlagUsage(typer.BadParameter):
    """A tokenizer flag missing or misplaced: exit 2, the message as is (no "Invalid value")."""

    def format_message(self) -> str:
        return self.message


def tokenizer_spec(
    tokenizer_type: str,
    vocab_file: Path | None,
    merge_file: Path | None,
    tokenizer_name_or_path: str | None,
    eod_token: str | None,
) -> TokenizerSpec:
    """The validated flags; a missing or misplaced flag is a usage error (exit 2)."""
    try:
        return TokenizerSpec(
            tokenizer_type=tokenizer_type,
            vocab_file=vocab_file,
            merge_file=merge_file,
            tokenizer_name_or_path=tokenizer_name_or_path,
            eod_token=eod_token,
        )
    except TokenizerFlagError as error:
        raise TokenizerFlagUsage(str(error)) from None


__all__ = [
    "GPT2_BPE",
    "EodToken",
    "MergeFile",
    "TokenizerNameOrPath",
    "TokenizerType",
    "VocabFile",
    "tokenizer_spec",
]
