"""`python -m mds_train` (torchrun's `-m` form) runs the mds-train command."""

from mds_train.cli import script

if __name__ == "__main__":
    script()
