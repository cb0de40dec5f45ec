"""The one exception type for user-facing dataset problems; CLIs print its message as one line."""


class IndexedDatasetError(ValueError):
    """A dataset file is missing, malformed or inconsistent; the message names the file."""
