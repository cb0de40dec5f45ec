"""The tokenizer a dataset was made with, as its JSON sidecar records it, so that `merge` refuses
to join datasets whose token ids mean different things.

Sidecars read: `PREFIX.tokenize.json` (mds-tokenize) and `PREFIX.merge.json` (mds-index merge); the
record's forms and its comparison are `mds_common.tokenizer_record`'s. A dataset without one
(e.g. made by Megatron) is not checked.
"""

import json
from pathlib import Path

from mds_common.tokenizer_record import TokenizerRecord

SIDECAR_SUFFIXES = (".tokenize.json", ".merge.json")


def recorded_vocabulary(prefix: str | Path) -> TokenizerRecord | None:
    """The tokenizer a dataset's sidecar records, or None when no readable sidecar names one."""
    for suffix in SIDECAR_SUFFIXES:
        path = Path(f"{prefix}{suffix}")
        try:
            metadata = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(metadata, dict) and (found := TokenizerRecord.from_sidecar(metadata)):
            return found
    return None
