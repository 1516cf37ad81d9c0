"""The onepass servers the bench measures, each in its own process, and what it reads of them."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.fleet.processes import READY, ServerProcess


@contextmanager
def onepass_server(model: Path, *extra: str, checkout: Path | None = None) -> Iterator[tuple[str, int]]:
    """A server on `model`; its snapshot disk tier is off unless `extra` turns it on (a cold
    request must be cold, not a disk hit left by an earlier run). With `checkout`, the server of
    another onepass checkout (an older engine, say) runs, with that checkout's own venv."""
    args = ["--model", str(model), "--n-ctx", "8192", "--session-cache-disk-bytes", "0", *extra]
    if checkout is None:
        server = ServerProcess(args)
    else:
        server = ServerProcess(args, command=(str(venv_python(checkout)), "-m", "app"), cwd=checkout)
    try:
        server.wait_for(READY)
        yield server.url, server.pid
    finally:
        server.stop()


def venv_python(checkout: Path) -> Path:
    """The Python of a checkout's own venv (make setup's .venv)."""
    return checkout / ".venv" / "bin" / "python"


def engine_of(checkout: Path) -> str:
    """The llama.cpp build in another checkout's venv: its version and system info."""
    code = "import llama_cpp; print(llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())"
    run = subprocess.run([str(venv_python(checkout)), "-c", code], check=True, capture_output=True, text=True)
    return run.stdout.strip()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")
