"""On-disk cache of the three index arrays, named by a hash of every input that determines them.

Files: `{stem}_{name}_{hash}_{doc_idx,sample_idx,shuffle_idx}.npy` and `{stem}_{name}_{hash}.json`.
The hash covers the token counts of the split's documents (content, not path or mtime), the range,
n, L, seed, cutoff and the format version. Arrays are renamed into place first and the JSON last, so
a JSON that matches its arrays' shapes marks a complete cache; anything else is rebuilt, never used.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mds_common.files import atomic_write
from mds_common.sidecar import sidecar, write_json

from mds_indexed_data.sample_index import IndexMappings

CACHE_FORMAT = "mds-gpt-sample-index/1"
ARRAY_NAMES = ("doc_idx", "sample_idx", "shuffle_idx")


@dataclass(frozen=True)
class CacheKey:
    """The inputs of `build_index_mappings`; `sizes_digest` stands for the sizes of the range."""

    data_prefix: str
    split_name: str
    document_range: tuple[int, int]
    sizes_digest: str
    num_samples: int
    seq_length: int
    seed: int
    cutoff: float

    def determining_inputs(self) -> dict:
        # The prefix and split name only make file names readable: identical token counts give
        # identical arrays wherever the data lives, so they are left out of the hash.
        return {
            "format": CACHE_FORMAT,
            "document_range": list(self.document_range),
            "sizes_blake2b": self.sizes_digest,
            "num_samples": self.num_samples,
            "seq_length": self.seq_length,
            "seed": self.seed,
            "separate_last_epoch_cutoff": self.cutoff,
        }

    def digest(self) -> str:
        text = json.dumps(self.determining_inputs(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def sizes_digest(sizes: np.ndarray, document_range: tuple[int, int]) -> str:
    start, end = document_range
    chunk = np.ascontiguousarray(sizes[start:end], dtype="<i4")
    return hashlib.blake2b(chunk.data, digest_size=16).hexdigest()


def cache_paths(key: CacheKey, cache_dir: Path) -> dict[str, Path]:
    """Paths of the description ("json") and of each array, by name."""
    stem = f"{Path(key.data_prefix).name}_{key.split_name}_{key.digest()}"
    paths = {name: cache_dir / f"{stem}_{name}.npy" for name in ARRAY_NAMES}
    paths["json"] = cache_dir / f"{stem}.json"
    return paths


def load_cache(key: CacheKey, cache_dir: Path) -> tuple[IndexMappings, dict] | None:
    """The cached arrays (mapped read-only) and description, or None if absent or unusable."""
    paths = cache_paths(key, cache_dir)
    try:
        description = json.loads(paths["json"].read_text())
    except (OSError, ValueError):
        return None
    # Caches written before the sidecar vocabulary kept the determining inputs under "inputs".
    determining = description.get("determining_inputs", description.get("inputs"))
    if determining != key.determining_inputs():
        return None
    arrays = {}
    for name in ARRAY_NAMES:
        expected = description.get("arrays", {}).get(name, {})
        try:
            array = np.load(paths[name], mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError):
            return None
        if list(array.shape) != expected.get("shape") or str(array.dtype) != expected.get("dtype"):
            return None
        arrays[name] = array
    mappings = IndexMappings(
        doc_idx=arrays["doc_idx"],
        sample_idx=arrays["sample_idx"],
        shuffle_idx=arrays["shuffle_idx"],
        num_epochs=int(description["num_epochs"]),
        separate_last_epoch=bool(description["separate_last_epoch"]),
    )
    return mappings, description


def save_cache(key: CacheKey, cache_dir: Path, mappings: IndexMappings, extra: dict) -> dict:
    """Writes the arrays then the description, each under its temporary name (with this process's
    PID and host) and renamed, with the common sidecar keys (tool, version, inputs) first.

    Concurrent builders of one key write identical bytes, so whichever rename lands last is right.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = cache_paths(key, cache_dir)
    description = {
        **sidecar(
            tool="mds-index build", distribution="mds-indexed-data", inputs=[key.data_prefix]
        ),
        "determining_inputs": key.determining_inputs(),
        "data_prefix": key.data_prefix,
        "split_name": key.split_name,
        "num_epochs": mappings.num_epochs,
        "separate_last_epoch": mappings.separate_last_epoch,
        "num_samples_available": int(mappings.sample_idx.shape[0]) - 1,
        "arrays": {
            name: {"file": paths[name].name, "shape": list(array.shape), "dtype": str(array.dtype)}
            for name in ARRAY_NAMES
            for array in [getattr(mappings, name)]
        },
        **extra,
    }
    for name in ARRAY_NAMES:
        with atomic_write(paths[name]) as file:
            np.save(file, getattr(mappings, name))
    write_json(paths["json"], description)
    return description
