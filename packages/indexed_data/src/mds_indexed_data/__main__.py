"""`python -m mds_indexed_data` runs the `mds-index` command line."""

from mds_indexed_data.cli import main

main()
