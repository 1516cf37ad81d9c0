"""Start `python -m app` in a subprocess on a port the OS picks, and wait for its log lines.

For the bench and the tests: the server binds port 0 itself and logs "listening on URL",
so no port is picked and released before the server takes it (another process could take it
in between). A thread reads the server's log as it comes, so a waiter never polls and the
pipe never fills up.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"listening on (http://\S+)")
READY = "ready: serving"


class ServerProcess:
    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 300) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", "0", "--log-level", "info", *args],
            cwd=REPO_ROOT,
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []  # every log line so far
        self._changed = threading.Condition()
        self._ended = False
        threading.Thread(target=self._read, name="onepass-log-reader", daemon=True).start()
        match = LISTENING.search(self.wait_for(LISTENING.pattern, timeout))
        assert match is not None
        self.url = match.group(1)

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = 300, after: int = 0) -> str:
        """The first log line from index `after` on that matches `pattern`; an error if the server
        exits or `timeout` passes first."""
        expression = re.compile(pattern)

        def first() -> str | None:
            return next((line for line in self.lines[after:] if expression.search(line)), None)

        with self._changed:
            if not self._changed.wait_for(lambda: first() is not None or self._ended, timeout):
                raise TimeoutError(f"no log line matching {pattern!r} in {timeout:g} s; last: {self.lines[-5:]}")
            line = first()
        if line is None:
            code = self.process.wait(60)
            raise RuntimeError(f"the server exited ({code}) before logging {pattern!r}; last: {self.lines[-5:]}")
        return line

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit status (killed after `timeout`)."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout)
