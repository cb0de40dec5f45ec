"""`python -m mds_generate` runs the mds-generate command line."""

from .cli import script

script()
