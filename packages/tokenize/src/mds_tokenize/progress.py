"""Progress of a long tokenization: a redrawn bar on a terminal, periodic log lines otherwise.

Like Megatron's `Processed N documents (x docs/s, y MB/s).` lines (README: "Progress lines"), with
the ETA added; MB are input bytes (decompressed), MB = 10^6 bytes. When and where it shows is
`mds_common.progress.Meter`'s business.
"""

import logging
import time
from collections.abc import Callable
from typing import TextIO

from mds_common.progress import Meter, eta_seconds, format_duration

logger = logging.getLogger(__name__)


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
        self.log_interval_docs = log_interval_docs
        self.meter = Meter(
            interactive=interactive,
            stream=stream,
            log_seconds=log_interval_seconds,
            clock=clock,
            logger=logger,
        )
        self._next_docs = log_interval_docs

    def _fraction(self, position: int) -> float:
        return min(position / self.total, 1.0) if self.total > 0 else 0.0

    def rates(self, *, num_docs: int, num_bytes: int, position: int) -> str:
        elapsed = self.meter.elapsed()
        text = (
            f"{num_docs:,} docs ({num_docs / elapsed:,.0f} docs/s), "
            f"{num_bytes / 1e6:,.1f} MB ({num_bytes / elapsed / 1e6:.1f} MB/s)"
        )
        if self.total > 0 and position > 0:
            fraction = self._fraction(position)
            remaining = eta_seconds(elapsed=elapsed, fraction=fraction)
            text += f", {fraction:.0%}, ETA {format_duration(remaining)}"
        return text

    def update(self, *, num_docs: int, num_bytes: int, position: int) -> None:
        if self.meter.interactive:
            if self.meter.draw_due():
                rates = self.rates(num_docs=num_docs, num_bytes=num_bytes, position=position)
                self.meter.draw(self._fraction(position), rates)
            return
        if self._next_docs is not None:
            if num_docs < self._next_docs:
                return
            while self._next_docs <= num_docs:
                self._next_docs += self.log_interval_docs
        elif not self.meter.log_due():
            return
        logger.info(
            "processed %s", self.rates(num_docs=num_docs, num_bytes=num_bytes, position=position)
        )

    def close(self) -> None:
        self.meter.close()
