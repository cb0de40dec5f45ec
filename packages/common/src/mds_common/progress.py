"""Progress of long offline work, the house way: on a terminal a bar redrawn in place on stderr;
otherwise (SLURM logs, pipes) a log line now and then. Tools compose the text (docs/s, MB/s, ETA);
`Meter` decides when to show it and draws it.
"""

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 30
LINE_WIDTH = 110


def format_duration(seconds: float) -> str:
    """H:MM:SS."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def eta_seconds(*, elapsed: float, fraction: float) -> float:
    """Remaining time at the rate so far; infinite before any progress."""
    if fraction <= 0:
        return float("inf")
    return elapsed * (1 - min(fraction, 1.0)) / fraction


class Meter:
    """When and where progress shows. `interactive` (default: the stream is a terminal) draws a bar
    at most every `refresh_seconds`; otherwise `log_due()` is true every `log_seconds`, and the
    caller logs its line through `logger`."""

    def __init__(
        self,
        *,
        interactive: bool | None = None,
        stream: TextIO | None = None,
        refresh_seconds: float = 0.2,
        log_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ):
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.refresh_seconds = refresh_seconds
        self.log_seconds = log_seconds
        self.clock = clock
        self.logger = logger or logging.getLogger(__name__)
        self.start = self.last_shown = clock()
        self._drawn = False

    def elapsed(self) -> float:
        return max(self.clock() - self.start, 1e-9)

    def _due(self, interval: float) -> bool:
        now = self.clock()
        if now - self.last_shown < interval:
            return False
        self.last_shown = now
        return True

    def draw_due(self) -> bool:
        """On a terminal: whether the bar should be redrawn now (and count it as redrawn)."""
        return self.interactive and self._due(self.refresh_seconds)

    def log_due(self) -> bool:
        """Off a terminal: whether a log line is due now (and count it as logged)."""
        return not self.interactive and self._due(self.log_seconds)

    def draw(self, fraction: float, text: str, *, label: str = "") -> None:
        """Redraws `label [#####.....] text` in place."""
        filled = int(BAR_WIDTH * min(max(fraction, 0.0), 1.0))
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        line = f"{label} [{bar}] {text}" if label else f"[{bar}] {text}"
        self.stream.write("\r" + line.ljust(LINE_WIDTH))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Clears the bar, leaving the line to what follows (the summary log line)."""
        if self._drawn:
            self.stream.write("\r" + " " * LINE_WIDTH + "\r")
            self.stream.flush()
            self._drawn = False
