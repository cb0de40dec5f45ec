"""`python -m mds_checkpoint` runs `mds-merge-mp`."""

from .cli import script

script()
