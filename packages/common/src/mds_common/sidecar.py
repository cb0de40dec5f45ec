"""The JSON files every tool writes beside its outputs (`X.tokenize.json`, `OUT.merge.json`,
`learn-config.json`, the sample-index cache descriptions): one vocabulary of keys, one writer.

The vocabulary is written down in this package's README ("Sidecar JSON keys"); a key that means the
same thing in two files is spelled the same in both.
"""

import json
import os
from collections.abc import Iterable
from functools import cache
from importlib import metadata
from pathlib import Path

from mds_common.files import write_text_atomically

# Written first, in this order, by every sidecar; the rest follow in the caller's order.
COMMON_KEYS = ("tool", "version", "inputs")


@cache
def distribution_version(distribution: str) -> str:
    """The installed version of `distribution` (its pyproject's version), read from the package
    metadata at run time so that each package states its version once."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def absolute_paths(paths: Iterable[str | os.PathLike]) -> list[str]:
    return [str(Path(path).resolve()) for path in paths]


def sidecar(*, tool: str, distribution: str, inputs: Iterable[str | os.PathLike], **fields) -> dict:
    """The sidecar's content: `tool` (the command, e.g. "mds-index merge"), `version` (of
    `distribution`), `inputs` (absolute paths, in order), then `fields` as given."""
    clashes = set(fields) & set(COMMON_KEYS)
    if clashes:
        raise ValueError(f"sidecar fields {sorted(clashes)} are set from the arguments")
    return {
        "tool": tool,
        "version": distribution_version(distribution),
        "inputs": absolute_paths(inputs),
        **fields,
    }


def write_json(path: str | os.PathLike, content: dict) -> Path:
    """Writes `content` as indented UTF-8 JSON, atomically (temporary name, fsync, rename)."""
    return write_text_atomically(path, json.dumps(content, indent=2, ensure_ascii=False) + "\n")


def write_sidecar(
    path: str | os.PathLike,
    *,
    tool: str,
    distribution: str,
    inputs: Iterable[str | os.PathLike],
    **fields,
) -> dict:
    """Builds the sidecar (see `sidecar`) and writes it to `path` atomically; returns it."""
    content = sidecar(tool=tool, distribution=distribution, inputs=inputs, **fields)
    write_json(path, content)
    return content
