"""A progress bar on stderr: redrawn in place on a terminal; a log (not a terminal) gets the last line only."""
from __future__ import annotations

import sys
import threading
import time


class Progress:
    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.t0, self._drawn = time.perf_counter(), 0.0
        self.note = ""
        self._lock = threading.Lock()

    def update(self, n: int = 1, note: str | None = None) -> None:
        with self._lock:
            self.done += n
            self.note = self.note if note is None else note
            now = time.perf_counter()
            if self.live and (now - self._drawn > 0.1 or self.done >= self.total):
                self._drawn = now
                self._draw(now, end="")

    def _draw(self, now: float, end: str) -> None:
        frac = self.done / max(self.total, 1)
        bar = "#" * int(24 * frac)
        elapsed = now - self.t0
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        print(f"\r{self.label} [{bar:<24}] {self.done}/{self.total} {elapsed:5.0f}s eta {eta:4.0f}s {self.note:<28}",
              end=end, file=self.stream, flush=True)

    def close(self) -> None:
        with self._lock:
            self._draw(time.perf_counter(), end="\n")
