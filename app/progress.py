"""Progress of long work: what is done of how many, elapsed time and an ETA, optionally shown as one
line on stderr rewritten in place (the CLI, the bench) or read by a client (a fitting job)."""

from __future__ import annotations

import sys
import threading
import time


class Progress:
    """Counted by any thread: a batch's requests may be answered side by side."""

    def __init__(self, total: int, label: str = "", *, show: bool = True) -> None:
        self._lock = threading.Lock()
        self.total, self.label, self.done = total, label, 0
        self._skipped = 0  # done without work (reused): not part of the pace
        self.began = time.monotonic()
        self.visible = show
        self._show()

    def eta_s(self) -> float | None:
        """Seconds left at the pace so far; None before the first step."""
        worked = self.done - self._skipped
        if not worked:
            return None
        return (time.monotonic() - self.began) / worked * (self.total - self.done)

    def skip(self, count: int, note: str = "") -> None:
        """Mark `count` items done that took no work (found from an earlier run)."""
        if count:
            with self._lock:
                self.done += count
                self._skipped += count
                self.began = time.monotonic()
                self._show(note)
                if self.visible and self.done == self.total:
                    sys.stderr.write("\n")

    def step(self, note: str = "") -> None:
        with self._lock:
            self.done += 1
            self._show(note)
            if self.visible and self.done == self.total:
                sys.stderr.write("\n")

    def _show(self, note: str = "") -> None:
        if not self.visible:
            return
        elapsed = time.monotonic() - self.began
        eta = self.eta_s()
        width = 24
        filled = width * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (width - filled)
        line = f"\r{self.label} [{bar}] {self.done}/{self.total} {_clock(elapsed)} elapsed, ETA {_clock(eta)} {note}"
        sys.stderr.write(line[:160].ljust(100))
        sys.stderr.flush()


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"
