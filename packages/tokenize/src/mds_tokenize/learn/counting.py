"""Streaming word counts for `mds-tokenize learn`: jsonl (optionally .gz/.xz/.zst) -> GPT-2
pretokenized words -> Counter, in parallel worker processes. Only the table of distinct words is
held in memory.

Words are the matches of GPT-2's split pattern (README: "GPT-2 byte-level BPE"), counted as raw
text; the byte-level mapping is applied once per distinct word afterwards.
"""

import itertools
import multiprocessing
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import regex

from mds_tokenize.byte_level import GPT2_SPLIT_PATTERN
from mds_tokenize.documents import parse_line
from mds_tokenize.input_reader import InputReader

# Lines are shipped to workers in blocks of about this many bytes: large enough to amortise the
# queue, small enough to keep every worker busy on small corpora.
BLOCK_BYTES = 1 << 20


def read_blocks(paths: tuple[Path, ...]) -> Iterator[tuple[tuple[str, int, bytes], int]]:
    """Yields ((path, number of the block's first line, whole lines), on-disk bytes consumed since
    the previous block) over all inputs, decompressing by extension (the encoder's reader)."""
    for path in paths:
        try:
            reader = InputReader(path, block_bytes=BLOCK_BYTES)
        except OSError as error:
            raise ValueError(
                f"--input {path}: cannot read it ({error.strerror}); check the file"
            ) from None
        with reader:
            position = 0
            for block in reader:
                yield (str(path), block.first_line, block.data), reader.position - position
                position = reader.position


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
                continue  # blank lines carry no document, as in the encoder
            # The encoder's line check: same accepted lines, same messages, lone surrogates refused.
            texts, reason = parse_line(line, self.json_keys)
            if texts is None:
                raise ValueError(f"{path}:{first_line + offset}: {reason}; fix or remove the line")
            for text in texts:
                self.words.update(self._find_words(text))
            self.num_documents += 1


def _count_worker(
    json_keys: tuple[str, ...], tasks: multiprocessing.Queue, results: multiprocessing.Queue
) -> None:
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
    progress in on-disk (compressed) input bytes. The result does not depend on `num_workers`."""
    blocks = read_blocks(paths)
    # Starting processes costs more than counting one block (1 MB) in place: a small corpus, or a
    # single worker, is counted here.
    first_blocks = list(itertools.islice(blocks, 2))
    if num_workers == 1 or len(first_blocks) < 2:
        counter = WordCounter(json_keys=json_keys)
        for chunk, num_disk_bytes in itertools.chain(first_blocks, blocks):
            counter.count_chunk(*chunk)
            if on_chunk is not None:
                on_chunk(num_disk_bytes)
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
        for chunk, num_disk_bytes in itertools.chain(first_blocks, blocks):
            tasks.put(chunk)
            if on_chunk is not None:
                on_chunk(num_disk_bytes)
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
