"""Bench output: results files written atomically (a crash or a full disk leaves the old file or none,
never half), and a progress line for runs that take minutes."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path


def write_atomically(path: Path, data: str | bytes) -> None:
    partial = path.with_name(path.name + ".tmp")  # git-ignored: bench/results/*.tmp
    with partial.open("wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    partial.replace(path)


class Progress:
    """One line on stderr, rewritten in place: what is done of how many, elapsed time and an ETA."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done = total, label, 0
        self.began = time.monotonic()
        self._show()

    def step(self, note: str = "") -> None:
        self.done += 1
        self._show(note)
        if self.done == self.total:
            sys.stderr.write("\n")

    def _show(self, note: str = "") -> None:
        elapsed = time.monotonic() - self.began
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        width = 24
        filled = width * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (width - filled)
        line = f"\r{self.label} [{bar}] {self.done}/{self.total} {_clock(elapsed)} elapsed, ETA {_clock(eta)} {note}"
        sys.stderr.write(line[:160].ljust(100))
        sys.stderr.flush()


def _clock(seconds: float) -> str:
    if seconds != seconds:  # NaN: nothing measured yet
        return "--:--"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def table(headers: list[str], rows: list[list[object]]) -> list[str]:
    """A Markdown table's lines."""
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows),
    ]


def median(samples: list[float]) -> float:
    """The median in ms, to a tenth."""
    return round(statistics.median(samples), 1)
