"""`mds-tokenize` end to end: jsonl -> `{prefix}_{key}_document.bin/.idx`, in input order.

Megatron's `preprocess_data.py` (README: "Documents and EOD") with the work cut into byte blocks
of whole lines: an ordered pool with a bounded number of blocks in flight (so memory stays flat),
one numpy array per block and key back from each worker, and the writer's bulk `add_documents`.
"""

import logging
import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from mds_common.sidecar import sidecar, write_json
from mds_indexed_data import IndexedDatasetWriter, best_fitting_dtype

from mds_tokenize.config import TokenizeConfig
from mds_tokenize.documents import BadLine, BlockResult, EncodeSettings, encode_block
from mds_tokenize.input_reader import Block, InputReader
from mds_tokenize.interface import Tokenizer, load_tokenizer
from mds_tokenize.progress import Progress

logger = logging.getLogger(__name__)

MIN_BLOCK_BYTES = 64 << 10
# Shown for the first few skipped lines; the rest are only counted.
NUM_BAD_LINES_SHOWN = 10


class BadLineError(ValueError):
    """A malformed input line while --skip-bad-lines is off."""


@dataclass
class TokenizeSummary:
    num_docs: int = 0
    num_bytes: int = 0
    seconds: float = 0.0
    num_tokens: dict[str, int] = field(default_factory=dict)
    num_empty: dict[str, int] = field(default_factory=dict)
    num_bad_lines: int = 0
    outputs: dict[str, str] = field(default_factory=dict)


def describe_line(config: TokenizeConfig, bad: BadLine) -> str:
    if config.partition is None:
        return f"{config.input}:{bad.line}"
    index, count = config.partition
    return (
        f"{config.input}: line {bad.line} of partition {index}/{count} (byte offset {bad.offset})"
    )


# One tokenizer per pool worker process: set by the initializer, read by the task function. With
# the fork start method it is inherited from the parent, not rebuilt or pickled.
_worker_context: tuple[Tokenizer, EncodeSettings] | None = None


def _init_worker(tokenizer: Tokenizer, settings: EncodeSettings) -> None:
    global _worker_context
    _worker_context = (tokenizer, settings)


def _encode_in_worker(block: Block) -> BlockResult:
    tokenizer, settings = _worker_context
    return encode_block(tokenizer, block, settings)


def _ordered_pool_results(
    pool, blocks: Iterable[Block], max_in_flight: int
) -> Iterator[BlockResult]:
    """Pool.imap would read the whole input ahead of the workers; this keeps at most
    `max_in_flight` blocks queued or in progress and yields results in input order."""
    pending = deque()
    for block in blocks:
        pending.append(pool.apply_async(_encode_in_worker, (block,)))
        if len(pending) >= max_in_flight:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _pool_context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def metadata_path(dataset: str) -> Path:
    return Path(dataset + ".tokenize.json")


@contextmanager
def _one_thread_per_worker():
    """`tokenizers` would spread every batch over all cores (and warn in forked workers); here
    parallelism is --workers processes of one encoding thread each, as for GPT-2."""
    name = "TOKENIZERS_PARALLELISM"
    saved = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def run(config: TokenizeConfig, *, tokenizer: Tokenizer | None = None) -> TokenizeSummary:
    """Tokenizes `config.input`; raises ValueError (naming file/line/flag) for user mistakes."""
    started = time.monotonic()
    if tokenizer is None:
        tokenizer = load_tokenizer(config.spec())
    if config.append_eod and not tokenizer.has_eod:
        try:
            tokenizer.eod  # noqa: B018 - its error says how to name an EOD
        except ValueError as error:
            raise ValueError(f"--append-eod: {error}") from None
    dtype = np.dtype(best_fitting_dtype(tokenizer.vocab_size))
    if tokenizer.max_token_id > np.iinfo(dtype).max:
        raise ValueError(
            f"{', '.join(map(str, tokenizer.files))}: {tokenizer.vocab_size} entries but ids up "
            f"to {tokenizer.max_token_id}, which do not fit {dtype}; renumber the vocab 0..N-1"
        )
    settings = EncodeSettings(
        json_keys=config.json_keys,
        append_eod=config.append_eod,
        dtype=dtype,
        stop_at_bad_line=not config.skip_bad_lines,
        keep_empty=config.deepspeedai_index,
    )
    summary = TokenizeSummary(
        num_tokens=dict.fromkeys(config.json_keys, 0),
        num_empty=dict.fromkeys(config.json_keys, 0),
        outputs={key: config.output_dataset(key) for key in config.json_keys},
    )
    with ExitStack() as stack:
        stack.enter_context(_one_thread_per_worker())
        reader = stack.enter_context(
            InputReader(config.input, block_bytes=config.block_bytes, partition=config.partition)
        )
        # Entered before the pool, so they exit after it: an error aborts them (no partial output).
        writers = {
            key: stack.enter_context(IndexedDatasetWriter(summary.outputs[key], dtype=dtype))
            for key in config.json_keys
        }
        if config.workers > 1:
            # Small inputs: smaller blocks so that every worker gets work from the start.
            reader.block_bytes = max(
                MIN_BLOCK_BYTES, min(config.block_bytes, reader.total // (4 * config.workers))
            )
        if config.workers == 1:
            results = (encode_block(tokenizer, block, settings) for block in reader)
        else:
            pool = stack.enter_context(
                _pool_context().Pool(
                    config.workers, initializer=_init_worker, initargs=(tokenizer, settings)
                )
            )
            results = _ordered_pool_results(pool, reader, max_in_flight=2 * config.workers + 1)
        progress = Progress(
            total=reader.total,
            interactive=sys.stderr.isatty(),
            log_interval_docs=config.log_interval,
        )
        stack.callback(progress.close)
        for result in results:
            _account_bad_lines(config, summary, result.bad_lines)
            for key, writer in writers.items():
                writer.add_documents(
                    result.ids[key],
                    result.lengths[key],
                    deepspeedai=config.deepspeedai_index,
                    uncounted_eod=config.append_eod,
                )
                summary.num_tokens[key] += len(result.ids[key])
                summary.num_empty[key] += result.num_empty[key]
            summary.num_docs += result.num_docs
            summary.num_bytes += result.num_bytes
            progress.update(
                num_docs=summary.num_docs, num_bytes=summary.num_bytes, position=reader.position
            )
    summary.seconds = time.monotonic() - started
    for key in config.json_keys:
        write_json(
            metadata_path(summary.outputs[key]),
            _metadata(config, summary, key, dtype, tokenizer),
        )
    _log_summary(summary)
    return summary


def _account_bad_lines(
    config: TokenizeConfig, summary: TokenizeSummary, bad_lines: list[BadLine]
) -> None:
    for bad in bad_lines:
        if not config.skip_bad_lines:
            raise BadLineError(
                f"{describe_line(config, bad)}: {bad.reason} (fix the line, or pass "
                "--skip-bad-lines "
                "to skip such lines)"
            )
        summary.num_bad_lines += 1
        if summary.num_bad_lines <= NUM_BAD_LINES_SHOWN:
            logger.warning("skipped %s: %s", describe_line(config, bad), bad.reason)
        elif summary.num_bad_lines == NUM_BAD_LINES_SHOWN + 1:
            logger.warning("more bad lines skipped; only their count is reported")


def _metadata(
    config: TokenizeConfig,
    summary: TokenizeSummary,
    key: str,
    dtype: np.dtype,
    tokenizer: Tokenizer,
) -> dict:
    settings = {name: value for name, value in asdict(config).items() if name != "block_bytes"}
    for name in ("input", "vocab_file", "merge_file"):
        if settings[name] is not None:
            settings[name] = str(Path(settings[name]).resolve())
    return sidecar(
        tool="mds-tokenize",
        distribution="mds-tokenize",
        inputs=[config.input, *tokenizer.files],
        config=settings,
        json_key=key,
        # Which tokenizer made the ids (interface.py): what `mds-index merge`, `mds-train` and
        # `check_dataset_tokenizer` compare against.
        vocabulary=tokenizer.record().to_json(),
        dtype=dtype.name,
        num_documents=summary.num_docs - summary.num_empty[key],
        num_tokens=summary.num_tokens[key],
        num_empty_documents_skipped=summary.num_empty[key],
        num_bad_lines_skipped=summary.num_bad_lines,
        num_input_bytes=summary.num_bytes,
    )


def _log_summary(summary: TokenizeSummary) -> None:
    seconds = max(summary.seconds, 1e-9)
    for key, dataset in summary.outputs.items():
        logger.info(
            "done %r: %s docs, %s tokens, %s bytes in %.2f s (%.1f MB/s, %s docs/s); "
            "skipped %d empty "
            "docs and %d bad lines -> %s.{bin,idx}",
            key,
            f"{summary.num_docs - summary.num_empty[key]:,}",
            f"{summary.num_tokens[key]:,}",
            f"{summary.num_bytes:,}",
            summary.seconds,
            summary.num_bytes / seconds / 1e6,
            f"{summary.num_docs / seconds:,.0f}",
            summary.num_empty[key],
            summary.num_bad_lines,
            dataset,
        )
