"""Streaming word counts for `mds-tokenize learn`: jsonl (optionally .gz/.xz/.zst) -> GPT-2 pretokenized
words -> Counter, in parallel worker processes. Only the table of distinct words is held in memory.

Words are the matches of GPT-2's split pattern (megatron-reference.md 3.2), counted as raw text; the
byte-level mapping is applied once per distinct word afterwards.
"""

import gzip
import json
import lzma
import multiprocessing
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import regex

from mds_tokenize.byte_level import GPT2_SPLIT_PATTERN

# Lines are shipped to workers in chunks of about this many bytes: large enough to amortise the
# queue, small enough to keep every worker busy on small corpora.
CHUNK_BYTES = 1 << 20


@contextmanager
def open_jsonl(path: Path) -> Iterator[BinaryIO]:
    """Opens a jsonl file for binary line reading, decompressing by extension."""
    suffix = path.suffix.lower()
    if suffix == ".gz":
        stream = gzip.open(path, "rb")
    elif suffix == ".xz":
        stream = lzma.open(path, "rb")
    elif suffix == ".zst":
        import io

        import zstandard

        raw = open(path, "rb")  # noqa: SIM115 - closed with the reader below
        stream = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    else:
        stream = open(path, "rb")  # noqa: SIM115 - closed in the finally below
    try:
        yield stream
    finally:
        stream.close()


def read_chunks(paths: tuple[Path, ...]) -> Iterator[tuple[str, int, bytes]]:
    """Yields (path, number of the chunk's first line, newline-joined lines) over all inputs."""
    for path in paths:
        line_number = 1
        try:
            with open_jsonl(Path(path)) as stream:
                while lines := stream.readlines(CHUNK_BYTES):
                    yield str(path), line_number, b"".join(lines)
                    line_number += len(lines)
        except (OSError, EOFError, lzma.LZMAError) as error:
            raise ValueError(f"--input {path}: cannot read it ({error}); check the file") from None
        except Exception as error:  # zstandard.ZstdError, without importing zstandard for plain files
            if type(error).__name__ != "ZstdError":
                raise
            raise ValueError(f"--input {path}: cannot decompress it ({error}); check the file") from None


class WordCounter:
    """Counts the pretokenized words of the given json keys in chunks of jsonl lines."""

    def __init__(self, *, json_keys: tuple[str, ...]) -> None:
        self.json_keys = json_keys
        self.words: Counter[str] = Counter()
        self.num_documents = 0
        self.num_bytes = 0
        self._find_words = regex.compile(GPT2_SPLIT_PATTERN).findall

    def count_chunk(self, path: str, first_line: int, chunk: bytes) -> None:
        """Counts one chunk; a malformed line raises ValueError naming file and line."""
        self.num_bytes += len(chunk)
        for offset, line in enumerate(chunk.split(b"\n")):
            if not line.strip():
                continue  # blank lines (e.g. a trailing one) carry no document
            where = f"{path}:{first_line + offset}"
            try:
                document = json.loads(line)
            except ValueError as error:
                raise ValueError(f"{where}: not valid JSON ({error}); fix or remove the line") from None
            if not isinstance(document, dict):
                raise ValueError(f"{where}: expected a JSON object per line, got {type(document).__name__}")
            for key in self.json_keys:
                text = document.get(key)
                if not isinstance(text, str):
                    problem = "has no key" if text is None else "has a non-string value for"
                    raise ValueError(f"{where}: document {problem} {key!r}; check --json-keys")
                self.words.update(self._find_words(text))
            self.num_documents += 1


def _count_worker(json_keys: tuple[str, ...], tasks: multiprocessing.Queue, results: multiprocessing.Queue) -> None:
    counter = WordCounter(json_keys=json_keys)
    error = None
    while (task := tasks.get()) is not None:
        if error is not None:
            continue  # keep draining so that the reader never blocks on a full queue
        try:
            counter.count_chunk(*task)
        except ValueError as failure:
            error = (task[0], task[1], str(failure))
    results.put((counter.words, counter.num_documents, counter.num_bytes, error))


def count_words(
    *,
    paths: tuple[Path, ...],
    json_keys: tuple[str, ...],
    num_workers: int,
    on_chunk: Callable[[int], None] | None = None,
) -> tuple[Counter[str], int]:
    """Returns (word -> count over all inputs, number of documents). `on_chunk(num_bytes)` reports
    progress in input (decompressed) bytes. The result does not depend on `num_workers`."""
    if num_workers == 1:
        counter = WordCounter(json_keys=json_keys)
        for chunk in read_chunks(paths):
            counter.count_chunk(*chunk)
            if on_chunk is not None:
                on_chunk(len(chunk[2]))
        return counter.words, counter.num_documents

    context = multiprocessing.get_context()
    tasks = context.Queue(maxsize=2 * num_workers)
    results = context.Queue()
    processes = [
        context.Process(target=_count_worker, args=(json_keys, tasks, results), daemon=True)
        for _ in range(num_workers)
    ]
    for process in processes:
        process.start()
    try:
        for chunk in read_chunks(paths):
            tasks.put(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk[2]))
    finally:
        for _ in processes:
            tasks.put(None)
    words: Counter[str] = Counter()
    num_documents = 0
    errors = []
    for _ in processes:
        worker_words, worker_documents, _num_bytes, error = results.get()
        words.update(worker_words)
        num_documents += worker_documents
        if error is not None:
            errors.append(error)
    for process in processes:
        process.join()
    if errors:
        # Report the first bad line in input order, whichever worker met it first.
        order = {str(path): position for position, path in enumerate(paths)}
        raise ValueError(min(errors, key=lambda error: (order[error[0]], error[1]))[2])
    return words, num_documents
