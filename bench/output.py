"""Bench output: results files written atomically (a crash or a full disk leaves the old file or none,
never half), and a progress line for runs that take minutes."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path

from app.paths import REPO_ROOT
from app.progress import Progress

__all__ = ["RESULTS", "Progress", "git_sha", "median", "table", "write_atomically"]

RESULTS = REPO_ROOT / "bench" / "results"


def git_sha(checkout: Path = REPO_ROOT) -> str:
    """The commit the bench runs (or another checkout holds), short: results files are named by it."""
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


def machine() -> str:
    """What a report says of the machine it ran on: architecture, cores, Python."""
    return f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"


def write_atomically(path: Path, data: str | bytes) -> None:
    partial = path.with_name(path.name + ".tmp")  # git-ignored: bench/results/*.tmp
    path.parent.mkdir(parents=True, exist_ok=True)  # a report's --out folder need not exist yet
    with partial.open("wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    partial.replace(path)


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
