"""`mds-tokenize learn`: the command that trains a GPT-2-format byte-level BPE vocabulary,
generated from `LearnConfig` (the signature is the configuration, litgpt style; mds_common.flags).

Everything else lives in `learner.py`. Registered as a subcommand by `mds_tokenize.cli`; errors
are reported by `mds_common.cli`.
"""

from typing import Any

from mds_common.flags import command_function, group_from_values

from mds_tokenize.learn.config import LearnConfig


def _learn(**values: Any) -> None:
    # Imported here so that `mds-tokenize --help` does not pay for the learner's imports.
    from mds_tokenize.learn.learner import run

    run(group_from_values(LearnConfig, values))


learn = command_function(
    _learn,
    [LearnConfig],
    name="learn",
    doc="Learn a byte-level BPE vocabulary (GPT-2-format vocab.json + merges.txt) from jsonl.",
)
