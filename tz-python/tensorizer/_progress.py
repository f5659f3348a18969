"""
A one-line progress bar for the command line: bytes done of total, rate and
ETA, redrawn in place on a terminal.

It writes only to a TTY (stderr by default), so piped or logged output stays
clean, and it redraws at most once per ``interval`` seconds, because a redraw
per batch could cost more than the work on fast storage. The first update
and the end are always drawn, so a short operation still shows its final
state, and that final frame does not depend on timing.
"""

import math
import os
import sys
import time
from typing import Callable, Optional, TextIO

__all__ = ["Progress", "format_bytes"]

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units, three significant digits: "1.23 GB"."""
    for unit in _UNITS:
        if abs(n) < 1000 or unit == _UNITS[-1]:
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.3g} {unit}" if n < 100 else f"{n:.0f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--:--"
    seconds = int(seconds + 0.5)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Shows progress of ``total`` bytes of work labelled ``label``.

    Call :meth:`update` with the bytes done so far (and the total, when it
    is known only once the work started: ``update`` fits the ``progress``
    callbacks of ``verify_file`` and ``rewrite``), then :meth:`finish` when
    the work completed, or :meth:`clear` when it failed (so an error message
    starts on a clean line). As a context manager it does either on exit.
    ``enabled`` defaults to whether ``stream`` is a terminal.
    """

    def __init__(
        self,
        label: str = "",
        total: int = 0,
        *,
        stream: Optional[TextIO] = None,
        enabled: Optional[bool] = None,
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = max(int(total), 0)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _isatty(self.stream) if enabled is None else enabled
        self.interval = interval
        self._clock = clock
        self._start = clock()
        self._last_draw: Optional[float] = None
        self._done = 0
        self._width = 0  # characters of the line last drawn, to blank it
        self._closed = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.clear()

    def update(self, done: int, total: Optional[int] = None) -> None:
        if total is not None:
            self.total = max(int(total), 0)
        self._done = min(max(int(done), 0), self.total) if self.total else max(int(done), 0)
        if not self.enabled or self._closed:
            return
        now = self._clock()
        if self._last_draw is not None and now - self._last_draw < self.interval:
            return
        self._draw(now)

    def finish(self) -> None:
        """Draws the final state (all of ``total`` done) and ends the line."""
        if self._closed:
            return
        self._closed = True
        if self.enabled:
            self._done = max(self._done, self.total)
            self._draw(self._clock())
            self._write("\n")

    def clear(self) -> None:
        """Blanks the bar, leaving the cursor at the start of the line."""
        if self._closed:
            return
        self._closed = True
        if self.enabled and self._width:
            self._write("\r" + " " * self._width + "\r")

    def render(self, now: float, columns: int) -> str:
        """The line for the current state, at most ``columns`` wide."""
        elapsed = max(now - self._start, 1e-9)
        rate = self._done / elapsed
        remaining = self.total - self._done
        eta = 0.0 if remaining <= 0 else (remaining / rate if rate > 0 else math.inf)
        percent = 100 * self._done // self.total if self.total else 100
        left = f"{self.label} {percent:3d}% " if self.label else f"{percent:3d}% "
        right = (
            f" {format_bytes(self._done)}/{format_bytes(self.total)}"
            f"  {format_bytes(rate)}/s  ETA {_format_duration(eta)}"
        )
        room = columns - 1 - len(left) - len(right) - 2  # 1: never touch the last column
        if room < 10:
            return (left.strip() + right)[: max(columns - 1, 0)]
        filled = room * percent // 100
        return f"{left}[{'#' * filled}{'-' * (room - filled)}]{right}"

    def _draw(self, now: float) -> None:
        self._last_draw = now
        line = self.render(now, _columns(self.stream))
        # Pad over a longer previous line instead of relying on terminal escapes.
        pad = " " * max(self._width - len(line), 0)
        self._width = len(line)
        self._write("\r" + line + pad)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            # A closed or vanished terminal must not fail the work itself.
            self.enabled = False


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _columns(stream) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    # A pseudo-terminal nobody sized reports 0 columns.
    return columns if columns > 0 else 80
