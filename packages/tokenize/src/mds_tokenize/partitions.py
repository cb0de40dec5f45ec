"""`mds-tokenize merge`: joins the shards of `--partition K/N` runs into one dataset per key.

Shard K of N of key `text` is `{prefix}_text_document.part-0000K-of-0000N.{bin,idx}`; shards are
concatenated in K order (Megatron's serial merge, README: "Merging shards"), which gives files
byte-identical to a single run over the whole input.
"""

import json
import logging
import re
from pathlib import Path

from mds_common.sidecar import write_sidecar
from mds_indexed_data import data_file_path, index_file_path, merge_datasets

from mds_tokenize.config import MergeConfig, dataset_prefix, partition_suffix
from mds_tokenize.pipeline import metadata_path

logger = logging.getLogger(__name__)

_SHARD_NAME = re.compile(r"\.part-(\d+)-of-(\d+)\.idx$")


def find_shards(dataset: str) -> list[str]:
    """Prefixes of every shard of `dataset`, in partition order; raises if any is missing."""
    base = Path(dataset)
    found: dict[int, dict[int, str]] = {}
    for path in base.parent.glob(base.name + ".part-*-of-*.idx"):
        match = _SHARD_NAME.search(path.name)
        if match is None or path.name[: match.start()] != base.name:
            continue
        index, count = int(match.group(1)), int(match.group(2))
        found.setdefault(count, {})[index] = str(path)[: -len(".idx")]
    if not found:
        raise ValueError(
            f"--output-prefix: no shards {base.name}.part-K-of-N.idx in {base.parent}/; run "
            "`mds-tokenize --partition K/N ...` with the same --output-prefix first"
        )
    if len(found) > 1:
        counts = ", ".join(str(count) for count in sorted(found))
        raise ValueError(
            f"{base}: shards of different partition counts N ({counts}) are present; delete the "
            "stale ones so that a single N remains"
        )
    ((count, shards),) = found.items()
    missing = [index for index in range(count) if index not in shards]
    if missing:
        listed = ", ".join(f"{index}/{count}" for index in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise ValueError(
            f"{base}: missing shards {listed}{more}; rerun `mds-tokenize --partition K/N` for them"
        )
    for prefix in shards.values():
        if not data_file_path(prefix).is_file():
            raise ValueError(
                f"{data_file_path(prefix)}: missing (the .idx exists); rerun that shard"
            )
    return [shards[index] for index in range(count)]


def merge(config: MergeConfig) -> dict[str, str]:
    """Merges every key's shards; returns key -> merged dataset prefix."""
    plans = {
        key: find_shards(dataset_prefix(config.output_prefix, key)) for key in config.json_keys
    }
    outputs = {}
    for key, shards in plans.items():
        output = dataset_prefix(config.output_prefix, key)
        merged = merge_datasets(shards, output)
        shard_metadata = [_read_metadata(shard) for shard in shards]
        write_sidecar(
            metadata_path(output),
            tool="mds-tokenize merge",
            distribution="mds-tokenize",
            inputs=shards,
            config={"output_prefix": config.output_prefix, "json_keys": list(config.json_keys)},
            json_key=key,
            num_partitions=len(shards),
            num_documents=merged.num_documents,
            num_tokens=merged.num_tokens,
            shard_metadata=shard_metadata,
        )
        logger.info(
            "merged %d shards -> %s.{bin,idx}: %s docs, %s tokens",
            len(shards),
            output,
            f"{len(merged):,}",
            f"{merged.num_tokens:,}",
        )
        if not config.keep_parts:
            for shard in shards:
                for path in (data_file_path(shard), index_file_path(shard), metadata_path(shard)):
                    path.unlink(missing_ok=True)
        outputs[key] = output
    return outputs


def _read_metadata(shard: str) -> dict | None:
    path = metadata_path(shard)
    if not path.is_file():
        return None
    return json.loads(path.read_text())


__all__ = ["find_shards", "merge", "partition_suffix"]
