"""Start `python -m app` (or another server: haproxy for a fleet) in a subprocess, and wait for its log lines.

For the bench, the tests and the fleet: the server binds port 0 itself and logs "listening on
URL", so no port is picked and released before the server takes it (another process could take
it in between). A thread reads the process's log as it comes, so a waiter never polls and the
pipe never fills up.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from app.paths import REPO_ROOT

LISTENING = re.compile(r"listening on (http://\S+)")
READY = "ready: serving"


class LoggedProcess:
    """A subprocess whose stderr a thread reads line by line as it comes: `wait_for` a line without
    polling, and a pipe that never fills up. `echo` also gets each line (to show it live)."""

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        echo: Callable[[str], None] | None = None,
        pass_fds: Sequence[int] = (),
        name: str | None = None,
        cwd: Path = REPO_ROOT,
    ) -> None:
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=pass_fds,
        )
        self.name = name or Path(argv[0]).name  # for errors
        self.lines: list[str] = []  # every log line so far
        self._echo = echo
        self._changed = threading.Condition()
        self._ended = False
        threading.Thread(target=self._read, name=f"log-reader-{self.pid}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if self._echo is not None:
                self._echo(line.rstrip("\n"))
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = 300, after: int = 0) -> str:
        """The first log line from index `after` on that matches `pattern`; an error if the process
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
            raise RuntimeError(f"{self.name} exited ({code}) before logging {pattern!r}; last: {self.lines[-5:]}")
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


class ServerProcess(LoggedProcess):
    """`python -m app` on a port it picks and logs; `url` once it listens."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        timeout: float = 300,
        echo: Callable[[str], None] | None = None,
        command: Sequence[str] = (sys.executable, "-m", "app"),
        cwd: Path = REPO_ROOT,
    ) -> None:
        """`command`: how the server is started (another Python, an installed `onepass` script)."""
        argv = [*command, "--port", "0", "--log-level", "info", *args]
        super().__init__(argv, env, echo, name="the onepass server", cwd=cwd)
        try:
            match = LISTENING.search(self.wait_for(LISTENING.pattern, timeout))
        except BaseException:
            self.stop()  # nobody else holds it yet
            raise
        assert match is not None
        self.url = match.group(1)


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A socket bound to host:port (0: a port the OS picks) and listening: from here a client may
    connect, and waits in the backlog until the server that is handed the socket accepts."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(backlog)
    except OSError:
        listener.close()
        raise
    return listener


def url_of(listener: socket.socket) -> str:
    """http://host:port of a bound socket (an IPv6 host in brackets)."""
    host, port = listener.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
