"""Progress of a long tokenization: a redrawn bar on a terminal, periodic log lines otherwise.

Like Megatron's `Processed N documents (x docs/s, y MB/s).` lines (README: "Progress lines"), with
the ETA added; MB are input bytes (decompressed), MB = 10^6 bytes.
"""

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

logger = logging.getLogger(__name__)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Call `update` after each block with running totals; `close` clears the bar."""

    def __init__(
        self,
        *,
        total: int,
        interactive: bool,
        log_interval_docs: int | None = None,
        log_interval_seconds: float = 10.0,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = total
        self.interactive = interactive
        self.log_interval_docs = log_interval_docs
        self.log_interval_seconds = log_interval_seconds
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.start = clock()
        self._last_draw = self.start
        self._next_docs = log_interval_docs
        self._drawn = False

    def rates(self, *, num_docs: int, num_bytes: int, position: int) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        text = (
            f"{num_docs:,} docs ({num_docs / elapsed:,.0f} docs/s), "
            f"{num_bytes / 1e6:,.1f} MB ({num_bytes / elapsed / 1e6:.1f} MB/s)"
        )
        if self.total > 0 and position > 0:
            fraction = min(position / self.total, 1.0)
            remaining = elapsed * (1 - fraction) / fraction
            text += f", {fraction:.0%}, ETA {format_duration(remaining)}"
        return text

    def update(self, *, num_docs: int, num_bytes: int, position: int) -> None:
        now = self.clock()
        if self.interactive:
            if now - self._last_draw < 0.2:
                return
            self._last_draw = now
            fraction = min(position / self.total, 1.0) if self.total > 0 else 0.0
            filled = int(fraction * 30)
            bar = "#" * filled + "." * (30 - filled)
            line = f"\r[{bar}] " + self.rates(
                num_docs=num_docs, num_bytes=num_bytes, position=position
            )
            self.stream.write(line.ljust(110))
            self.stream.flush()
            self._drawn = True
            return
        if self._next_docs is not None:
            if num_docs < self._next_docs:
                return
            while self._next_docs <= num_docs:
                self._next_docs += self.log_interval_docs
        elif now - self._last_draw < self.log_interval_seconds:
            return
        self._last_draw = now
        logger.info(
            "processed %s", self.rates(num_docs=num_docs, num_bytes=num_bytes, position=position)
        )

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()
            self._drawn = False
