"""Progress for `mds-tokenize learn`: a redrawn bar with the rate on a terminal, periodic log lines
(count, rate, ETA) otherwise, e.g. in SLURM logs; `mds_common.progress.Meter` decides when."""

import logging
import time

from mds_common.progress import Meter, eta_seconds

logger = logging.getLogger("mds_tokenize.learn")

TERMINAL_REFRESH_SECONDS = 0.1
LOG_INTERVAL_SECONDS = 10.0


class Progress:
    """Tracks `done` out of an approximate `total`; use as a context manager around the work."""

    def __init__(self, *, label: str, unit: str, total: float, stream=None) -> None:
        self.label = label
        self.unit = unit
        self.total = max(total, 1e-9)
        self.meter = Meter(
            stream=stream,
            refresh_seconds=TERMINAL_REFRESH_SECONDS,
            log_seconds=LOG_INTERVAL_SECONDS,
            clock=time.perf_counter,
            logger=logger,
        )
        self.done = 0.0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info) -> None:
        if exc_info[0] is not None:
            self.meter.close()
        elif self.meter.interactive:
            self.meter.draw(self.done / self.total, self._text(), label=self.label)
            self.meter.stream.write("\n")
        else:
            logger.info("%s: %s", self.label, self._text())

    def advance(self, amount: float) -> None:
        self.update(self.done + amount)

    def update(self, done: float) -> None:
        self.done = done
        if self.meter.draw_due():
            self.meter.draw(self.done / self.total, self._text(), label=self.label)
        elif self.meter.log_due():
            elapsed = self.meter.elapsed()
            remaining = eta_seconds(elapsed=elapsed, fraction=self.done / self.total)
            logger.info("%s: %s, ETA %.0fs", self.label, self._text(), remaining)

    def _text(self) -> str:
        elapsed = self.meter.elapsed()
        amount = f"{self.done:,.0f}" if self.done >= 100 else f"{self.done:.1f}"
        return f"{amount} {self.unit}, {self.done / elapsed:,.1f} {self.unit}/s, {elapsed:.1f}s"
