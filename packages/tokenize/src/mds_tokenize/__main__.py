"""`python -m mds_tokenize`: the same as the `mds-tokenize` command."""

from mds_tokenize.cli import main

main()
