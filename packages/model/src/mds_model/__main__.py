"""`python -m mds_model` runs the mds-model command line."""

from .cli import script

script()
