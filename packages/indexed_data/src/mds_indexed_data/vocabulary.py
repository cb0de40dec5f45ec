"""The vocabulary a dataset was tokenized with, as its JSON sidecar records it, so that `merge`
refuses to join datasets whose token ids mean different things.

Sidecars read: `PREFIX.tokenize.json` (mds-tokenize: a `vocabulary` object, or the `vocab_file` and
`merge_file` of its `config`, or those of its first shard) and `PREFIX.merge.json` (mds-index merge:
a `vocabulary` object). A dataset without one (e.g. made by Megatron) is not checked. A vocabulary
is GPT-2 style (`vocab_file` + `merge_file`) or a Hugging Face `tokenizer.json` (`tokenizer_file`,
`type` PretrainedFromHF); either may record its `eod_id`.
"""

import hashlib
import json
from pathlib import Path

SIDECAR_SUFFIXES = (".tokenize.json", ".merge.json")


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def describe_vocabulary(vocab_file: str | Path, merge_file: str | Path) -> dict:
    """The `vocabulary` object a tokenizer writes into its sidecar: absolute paths and contents'
    SHA-256, so that a copy of the same files elsewhere counts as the same vocabulary."""
    return {
        "vocab_file": str(Path(vocab_file).resolve()),
        "merge_file": str(Path(merge_file).resolve()),
        "vocab_sha256": file_sha256(vocab_file),
        "merge_sha256": file_sha256(merge_file),
    }


def _from_metadata(metadata: dict) -> dict | None:
    if isinstance(metadata.get("vocabulary"), dict):
        return metadata["vocabulary"]
    config = metadata.get("config")
    if isinstance(config, dict) and "vocab_file" in config and "merge_file" in config:
        return {"vocab_file": config["vocab_file"], "merge_file": config["merge_file"]}
    for shard in metadata.get("shard_metadata") or []:
        if isinstance(shard, dict) and (found := _from_metadata(shard)):
            return found
    return None


def recorded_vocabulary(prefix: str | Path) -> dict | None:
    """The vocabulary a dataset's sidecar records, or None when no readable sidecar names one."""
    for suffix in SIDECAR_SUFFIXES:
        path = Path(f"{prefix}{suffix}")
        try:
            metadata = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(metadata, dict) and (found := _from_metadata(metadata)):
            return found
    return None


def is_hugging_face(vocabulary: dict) -> bool:
    return vocabulary.get("type") == "PretrainedFromHF" or "tokenizer_sha256" in vocabulary


def vocabulary_label(vocabulary: dict) -> str:
    """A recorded vocabulary in a few words, for messages."""
    if is_hugging_face(vocabulary):
        where = vocabulary.get("tokenizer_file") or vocabulary.get("name_or_path")
        return f"PretrainedFromHF {where}"
    return f"{vocabulary.get('vocab_file')} + {vocabulary.get('merge_file')}"


def _identity(vocabulary: dict) -> tuple:
    """Contents' hashes when recorded or still readable, else the paths."""
    if is_hugging_face(vocabulary):
        digest, file = vocabulary.get("tokenizer_sha256"), vocabulary.get("tokenizer_file")
        if digest is None and file is not None:
            try:
                digest = file_sha256(file)
            except OSError:
                pass
        return ("sha256", digest) if digest else ("path", file or vocabulary.get("name_or_path"))
    hashes = []
    for key in ("vocab", "merge"):
        digest = vocabulary.get(f"{key}_sha256")
        if digest is None:
            try:
                digest = file_sha256(vocabulary[f"{key}_file"])
            except OSError:
                return ("paths", vocabulary["vocab_file"], vocabulary["merge_file"])
        hashes.append(digest)
    return ("sha256", *hashes)


def same_vocabulary(first: dict, second: dict) -> bool:
    """Same files (by content where known, else by path) and, where both record one, same EOD."""
    if None not in (first.get("eod_id"), second.get("eod_id")):
        if first["eod_id"] != second["eod_id"]:
            return False
    if is_hugging_face(first) != is_hugging_face(second):
        return False
    if not all(
        is_hugging_face(v) or {"vocab_file", "merge_file"} <= v.keys() for v in (first, second)
    ):
        return first == second  # a tokenizer built in memory names no files: only itself matches
    if not is_hugging_face(first) and (first["vocab_file"], first["merge_file"]) == (
        second["vocab_file"],
        second["merge_file"],
    ):
        return True
    return _identity(first) == _identity(second)
