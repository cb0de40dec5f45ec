"""`python -m mds_train` (torchrun's `-m` form) runs the mds-train command."""

from mds_train.cli import main

if __name__ == "__main__":
    main()
