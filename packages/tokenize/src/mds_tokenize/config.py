"""Frozen, validated configurations of `mds-tokenize` (encode) and `mds-tokenize merge`.

Errors name the flag to fix. Flag spellings follow Megatron's `tools/preprocess_data.py`
(README: "Megatron's flags"); `--partition K/N` is 0-based so `--array=0-(N-1)` fits.
"""

from dataclasses import dataclass
from pathlib import Path

from mds_common.flags import flag, restate

from mds_tokenize.flags import TokenizerFlags

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
class JsonKeysFlags:
    """`--json-keys`, declared once for encode, merge and learn."""

    json_keys: tuple[str, ...] = flag(
        "--json-keys",
        multiple=True,
        default=("text",),
        help="Keys of each jsonl object whose text is read: --json-keys text title.",
    )


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig(TokenizerFlags):
    """`mds-tokenize encode`: the tokenizer flags (mds_tokenize.flags) and these."""

    input: Path = flag(
        "--input",
        required=True,
        help="jsonl file, one JSON object per line; .gz/.xz/.zst are decompressed by extension.",
    )
    # A prefix, not a path: Megatron appends to the string as given (Path would drop a final "/").
    output_prefix: str = flag(
        "--output-prefix",
        required=True,
        help="Writes {prefix}_{key}_document.bin/.idx per JSON key.",
    )
    json_keys: tuple[str, ...] = restate(JsonKeysFlags, "json_keys", note="One dataset each.")
    append_eod: bool = flag(
        "--append-eod",
        default=False,
        help="Append the tokenizer's EOD (GPT-2: <|endoftext|>; GPTSentencePieceTokenizer: eos; "
        "SentencePieceTokenizer: <EOD>) to every non-empty document.",
    )
    deepspeedai_index: bool = flag(
        "--deepspeedai-index",
        default=False,
        help="Write the .idx as deepspeedai/Megatron-DeepSpeed's preprocess_data.py (6acc370a) "
        "does, byte for byte: with --append-eod each size leaves out the EOD the .bin holds "
        "(so the index drifts a token per document), and an empty document keeps its doc_idx "
        "entry. Off: bigscience's and NVIDIA's index, whose documents end at their EOD.",
    )
    workers: int = flag(
        "--workers", default=1, help="Encoding processes; output is identical for any number."
    )
    partition: tuple[int, int] | None = flag(
        "--partition",
        cli_type=str | None,
        parse=parse_partition,
        help="K/N, K 0-based: tokenize only the K-th of N byte ranges "
        "(e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); join with `mds-tokenize merge`.",
    )
    skip_bad_lines: bool = flag(
        "--skip-bad-lines",
        default=False,
        help="Skip and count malformed lines instead of stopping at the first.",
    )
    log_interval: int | None = flag(
        "--log-interval",
        help="Without a terminal, log progress every N documents",
        shown_default="every 10 s",
    )
    block_bytes: int = 1 << 20

    def __post_init__(self):
        if not Path(self.input).is_file():
            raise ValueError(
                f"--input: {self.input} is not a file; pass a .jsonl file "
                "(or .jsonl.gz / .jsonl.xz / .jsonl.zst)"
            )
        self.spec()  # validates the tokenizer flags
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
            if self.deepspeedai_index:
                raise ValueError(
                    "--deepspeedai-index: not with --partition (merging keeps only the bytes an "
                    "index covers); tokenize the whole input in one run"
                )
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
    """`mds-tokenize merge`."""

    output_prefix: str = flag(
        "--output-prefix",
        required=True,
        help="The --output-prefix the partitioned runs used; writes "
        "{prefix}_{key}_document.bin/.idx.",
    )
    json_keys: tuple[str, ...] = restate(
        JsonKeysFlags, "json_keys", note="Those whose shards to merge."
    )
    keep_parts: bool = flag(
        "--keep-parts", default=False, help="Keep the shard files after merging."
    )

    def __post_init__(self):
        if not self.output_prefix:
            raise ValueError("--output-prefix: give the prefix the partitioned runs used")
        _check_json_keys(self.json_keys)
