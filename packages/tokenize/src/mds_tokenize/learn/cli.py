"""`mds-tokenize learn`: the thin typer command that trains a GPT-2-format byte-level BPE
vocabulary.

The signature is the configuration (litgpt style); everything else lives in `learner.py`.
Registered as a subcommand by `mds_tokenize.cli`; errors are reported by `mds_common.cli`.
"""

from pathlib import Path
from typing import Annotated

import typer

from mds_tokenize.byte_level import END_OF_TEXT


def learn(
    inputs: Annotated[
        list[Path],
        typer.Option(
            "--input",
            help="jsonl corpus to learn from (.jsonl, .jsonl.gz, .jsonl.xz or .jsonl.zst by "
            "extension); several: --input a.jsonl b.jsonl.zst.",
        ),
    ],
    vocab_size: Annotated[
        int,
        typer.Option(
            "--vocab-size",
            help="Number of entries in vocab.json: 256 byte tokens + learned tokens + special "
            "tokens.",
        ),
    ],
    output_dir: Annotated[
        Path,
        typer.Option(
            "--output-dir",
            help="Folder for vocab.json, merges.txt, learn-config.json (and tokenizer.json).",
        ),
    ],
    json_keys: Annotated[
        list[str],
        typer.Option(
            "--json-keys",
            help="Keys of each jsonl object whose text is learned from: --json-keys text title.",
        ),
    ] = ["text"],  # noqa: B006 - typer reads the default, nothing mutates it
    min_frequency: Annotated[
        int,
        typer.Option(
            "--min-frequency",
            help="Stop merging when the most frequent pair occurs fewer times than this.",
        ),
    ] = 2,
    special_tokens: Annotated[
        list[str],
        typer.Option(
            "--special-tokens",
            help=f"Special tokens appended after the merges, in order: --special-tokens A B. "
            f"{END_OF_TEXT} "
            "(the EOD) is always included, added last when not listed.",
        ),
    ] = [END_OF_TEXT],  # noqa: B006 - typer reads the default, nothing mutates it
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Processes counting words in parallel (default: every CPU this process may use).",
        ),
    ] = None,
    tokenizer_json: Annotated[
        bool,
        typer.Option(
            "--tokenizer-json",
            help="Also write tokenizer.json: the same vocabulary for Hugging Face tokenizers "
            "(identical ids; use with --tokenizer-type PretrainedFromHF).",
        ),
    ] = False,
) -> None:
    """Learn a byte-level BPE vocabulary (GPT-2-format vocab.json + merges.txt) from jsonl."""
    # Imported here so that `mds-tokenize --help` does not pay for the learner's imports.
    from mds_tokenize.learn.config import LearnConfig
    from mds_tokenize.learn.learner import run

    config = LearnConfig(
        inputs=tuple(inputs),
        json_keys=tuple(json_keys),
        vocab_size=vocab_size,
        output_dir=output_dir,
        min_frequency=min_frequency,
        special_tokens=tuple(special_tokens),
        workers=workers,
        tokenizer_json=tokenizer_json,
    )
    run(config)
