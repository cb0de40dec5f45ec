"""`mds-tokenize learn`: byte-level BPE vocabularies in GPT-2's format (see the package README).

Modules: `cli` (the typer command), `config` (LearnConfig), `counting` (word counts over jsonl, in
parallel), `_merge` (the Cython merge loop), `learner` (`run`: count, merge, write), `progress`.
Nothing is imported here, so that `mds-tokenize --help` does not pay for the learner.
"""
