"""Progress for `mds-tokenize learn`: a redrawn bar with the rate on a terminal, periodic log lines
(count, rate, ETA) otherwise, e.g. in SLURM logs."""

import logging
import sys
import time

logger = logging.getLogger("mds_tokenize.learn")

TERMINAL_REFRESH_SECONDS = 0.1
LOG_INTERVAL_SECONDS = 10.0
BAR_WIDTH = 30


class Progress:
    """Tracks `done` out of an approximate `total`; use as a context manager around the work."""

    def __init__(self, *, label: str, unit: str, total: float, stream=None) -> None:
        self.label = label
        self.unit = unit
        self.total = max(total, 1e-9)
        self.stream = stream if stream is not None else sys.stderr
        self.on_terminal = self.stream.isatty()
        self.done = 0.0
        self.started = self.last_shown = time.perf_counter()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info) -> None:
        if exc_info[0] is None:
            self._show(time.perf_counter(), final=True)

    def advance(self, amount: float) -> None:
        self.update(self.done + amount)

    def update(self, done: float) -> None:
        self.done = done
        now = time.perf_counter()
        interval = TERMINAL_REFRESH_SECONDS if self.on_terminal else LOG_INTERVAL_SECONDS
        if now - self.last_shown >= interval:
            self._show(now, final=False)

    def _show(self, now: float, *, final: bool) -> None:
        self.last_shown = now
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        amount = f"{self.done:,.0f}" if self.done >= 100 else f"{self.done:.1f}"
        text = f"{self.label}: {amount} {self.unit}, {rate:,.1f} {self.unit}/s, {elapsed:.1f}s"
        if self.on_terminal:
            filled = int(BAR_WIDTH * min(self.done / self.total, 1.0))
            bar = "#" * filled + "-" * (BAR_WIDTH - filled)
            self.stream.write(
                f"\r{self.label} [{bar}] {text[len(self.label) + 2 :]}" + ("\n" if final else "")
            )
            self.stream.flush()
        elif final:
            logger.info("%s", text)
        else:
            remaining = max(self.total - self.done, 0.0) / rate if rate > 0 else float("inf")
            logger.info("%s, ETA %.0fs", text, remaining)
