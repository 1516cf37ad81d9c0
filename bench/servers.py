"""The onepass servers the bench measures, each in its own process, and what it reads of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.fleet.processes import READY, ServerProcess


@contextmanager
def onepass_server(model: Path, *extra: str) -> Iterator[tuple[str, int]]:
    """A server on `model`; its snapshot disk tier is off unless `extra` turns it on (a cold
    request must be cold, not a disk hit left by an earlier run)."""
    server = ServerProcess(["--model", str(model), "--n-ctx", "8192", "--session-cache-disk-bytes", "0", *extra])
    try:
        server.wait_for(READY)
        yield server.url, server.pid
    finally:
        server.stop()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")
