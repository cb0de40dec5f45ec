"""Frozen, validated configurations of `mds-tokenize` (encode) and `mds-tokenize merge`.

Errors name the flag to fix. Flag spellings follow Megatron's `tools/preprocess_data.py`
(README: "Megatron's flags"); `--partition K/N` is 0-based so `--array=0-(N-1)` fits.
"""

from dataclasses import dataclass
from pathlib import Path

from mds_tokenize.interface import GPT2_BPE, TokenizerSpec

COMPRESSED_SUFFIXES = (".gz", ".xz", ".zst")


def parse_partition(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 0 <= K < N."""
    parts = text.split("/")
    try:
        index, count = (int(part) for part in parts)
    except ValueError:
        raise ValueError(
            f"--partition {text!r}: expected K/N with integers, e.g. --partition 0/8 "
            "(K is 0-based: 0..N-1, e.g. ${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT} "
            "with --array=0-7)"
        ) from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(
            f"--partition {text!r}: K must be in 0..N-1 (0-based) and N >= 1; "
            f"for N={count} use K from 0 to {count - 1} (SLURM: --array=0-{max(count - 1, 0)})"
        )
    return index, count


def partition_suffix(index: int, count: int) -> str:
    """Name part of a shard: zero padded so `ls` lists shards in merge order."""
    return f".part-{index:05d}-of-{count:05d}"


def dataset_prefix(output_prefix: str, key: str) -> str:
    """Megatron's `{output_prefix}_{key}_document` (document level; no sentence splitting)."""
    return f"{output_prefix}_{key}_document"


def _check_json_keys(json_keys: tuple[str, ...]) -> None:
    if not json_keys:
        raise ValueError("--json-keys: give at least one key, e.g. --json-keys text")
    if len(set(json_keys)) != len(json_keys):
        raise ValueError(
            f"--json-keys {' '.join(json_keys)}: a key is repeated; list each key once"
        )
    for key in json_keys:
        if not key or "/" in key:
            raise ValueError(
                f"--json-keys: {key!r} cannot be part of a file name; pick another key"
            )


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig:
    input: Path
    output_prefix: str
    # The tokenizer flags (interface.TokenizerSpec): GPT-2 files, or a Hugging Face tokenizer.
    vocab_file: Path | None = None
    merge_file: Path | None = None
    tokenizer_type: str = GPT2_BPE
    tokenizer_name_or_path: str | None = None
    eod_token: str | None = None
    json_keys: tuple[str, ...] = ("text",)
    append_eod: bool = False
    workers: int = 1
    partition: tuple[int, int] | None = None
    skip_bad_lines: bool = False
    log_interval: int | None = None
    block_bytes: int = 1 << 20

    def __post_init__(self):
        if not Path(self.input).is_file():
            raise ValueError(
                f"--input: {self.input} is not a file; pass a .jsonl file "
                "(or .jsonl.gz / .jsonl.xz / .jsonl.zst)"
            )
        self.tokenizer_spec()  # validates the tokenizer flags
        if not self.output_prefix or self.output_prefix.endswith("/"):
            raise ValueError(
                f"--output-prefix {self.output_prefix!r}: give a path prefix such as data/my-gpt2 "
                "(outputs are {prefix}_{key}_document.bin/.idx)"
            )
        _check_json_keys(self.json_keys)
        if self.workers < 1:
            raise ValueError(f"--workers {self.workers}: use 1 or more processes")
        if self.partition is not None:
            index, count = self.partition
            if count < 1 or not 0 <= index < count:
                raise ValueError(f"--partition {index}/{count}: K must be in 0..N-1")
            if self.is_compressed:
                raise ValueError(
                    f"--partition: {self.input} is compressed and cannot be split by byte ranges; "
                    "decompress it first or pass one compressed file per task"
                )
        if self.log_interval is not None and self.log_interval < 1:
            raise ValueError(
                f"--log-interval {self.log_interval}: use a positive number of documents"
            )
        if self.block_bytes < 1:
            raise ValueError("block_bytes must be positive")

    def tokenizer_spec(self) -> TokenizerSpec:
        return TokenizerSpec(
            tokenizer_type=self.tokenizer_type,
            vocab_file=self.vocab_file,
            merge_file=self.merge_file,
            tokenizer_name_or_path=self.tokenizer_name_or_path,
            eod_token=self.eod_token,
        )

    @property
    def is_compressed(self) -> bool:
        return Path(self.input).suffix in COMPRESSED_SUFFIXES

    def output_dataset(self, key: str) -> str:
        """Prefix of the .bin/.idx written for one JSON key (a shard's name when partitioned)."""
        prefix = dataset_prefix(self.output_prefix, key)
        if self.partition is None:
            return prefix
        return prefix + partition_suffix(*self.partition)


@dataclass(frozen=True, kw_only=True)
class MergeConfig:
    output_prefix: str
    json_keys: tuple[str, ...] = ("text",)
    keep_parts: bool = False

    def __post_init__(self):
        if not self.output_prefix:
            raise ValueError("--output-prefix: give the prefix the partitioned runs used")
        _check_json_keys(self.json_keys)
