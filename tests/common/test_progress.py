"""mds_common.progress.Meter: a throttled bar on a terminal; log lines otherwise, every interval."""

import io

from mds_common.progress import Meter, eta_seconds, format_duration


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_log_lines_off_a_terminal_every_interval():
    clock, stream = Clock(), io.StringIO()
    meter = Meter(interactive=False, stream=stream, log_seconds=10.0, clock=clock)
    due = []
    for second in range(0, 35, 5):
        clock.now = float(second)
        due.append(meter.log_due())
    assert due == [False, False, True, False, True, False, True]
    assert not meter.draw_due() and stream.getvalue() == ""


def test_bar_on_a_terminal_is_redrawn_in_place_and_cleared():
    clock, stream = Clock(), io.StringIO()
    meter = Meter(interactive=True, stream=stream, refresh_seconds=0.2, clock=clock)
    clock.now = 0.1
    assert not meter.draw_due() and not meter.log_due()
    clock.now = 0.3
    assert meter.draw_due()
    meter.draw(0.5, "1,000 docs", label="tokenizing")
    line = stream.getvalue()
    assert line.startswith("\rtokenizing [" + "#" * 15 + "." * 15 + "] 1,000 docs")
    meter.close()
    assert stream.getvalue().endswith("\r" + " " * 110 + "\r")


def test_durations():
    assert format_duration(3725.4) == "1:02:05"
    assert eta_seconds(elapsed=10.0, fraction=0.25) == 30.0
    assert eta_seconds(elapsed=10.0, fraction=0.0) == float("inf")
