"""A one-line text progress bar (no dependency)."""

from __future__ import annotations

import sys
import time

__all__ = ["ProgressBar"]


class ProgressBar:
    """``label  37/100 [#######.............] loss 1.234e-01  0.4 s`` on one line.

    Redraws at most every ``interval`` seconds, in place (carriage return), on
    ``stream`` (standard error by default).

    Args:
        total: expected number of updates.
        label: text before the counter.
        enabled: ``None`` shows the bar only when the stream is a terminal.
        width: characters of the bar.
    """

    def __init__(self, total: int, label: str = "", *, enabled: bool | None = None, stream=None,
                 width: int = 24, interval: float = 0.1):
        self.total = max(int(total), 1)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.width = width
        self.interval = interval
        self.start = time.perf_counter()
        self._last = -1.0
        self._drawn = False

    def update(self, count: int, loss: float | None = None, *, text: str | None = None,
               force: bool = False) -> None:
        """Redraw at ``count`` with an optional loss and free ``text`` after the bar."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        frac = min(count / self.total, 1.0)
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        line = f"{self.label} {count:>{len(str(self.total))}}/{self.total} [{bar}]"
        if loss is not None:
            line += f" loss {loss:.4e}"
        if text:
            line += f" {text}"
        line += f"  {now - self.start:.1f} s"
        self.stream.write("\r" + line)
        self.stream.flush()
        self._drawn = True

    def close(self, count: int, loss: float | None = None, *, text: str | None = None) -> None:
        if not self.enabled:
            return
        self.update(count, loss, text=text, force=True)
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
