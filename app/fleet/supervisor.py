"""make fleet: N onepass replicas on this machine behind HAProxy, which routes requests by state.

    python -m app.fleet.supervisor [--replicas N] [--host H] [--port P] [--config FILE] [-- flags for every replica]

The replicas listen on loopback ports they pick (`--port 0`) and are named replica1..N: their
X-Onepass-Replica header and HAProxy's server names. HAProxy runs deploy/haproxy.cfg with its
`server` lines replaced by those replicas, on a socket bound here first, so `--port 0` works and
requests sent before haproxy accepts wait in the socket's backlog. Ctrl-C or SIGTERM stops
haproxy, then every replica.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from app.fleet.processes import READY, LoggedProcess, ServerProcess, listening_socket, url_of
from app.paths import REPO_ROOT

log = logging.getLogger("onepass.fleet")

HAPROXY_CONFIG = REPO_ROOT / "deploy" / "haproxy.cfg"
BIND_ENV = "ONEPASS_FLEET_BIND"  # the config's listening address: here the socket bound for it, fd@N
MIN_HAPROXY = (2, 6)  # balance hash <expr>, json_query, sha2
LOAD_FAILED = "loading the model failed"  # app/http/server.py logs it, and the replica never gets ready


def haproxy_problem(binary: str = "haproxy") -> str | None:
    """Why the fleet cannot run here, in words; None when it can."""
    path = shutil.which(binary)
    if path is None:
        return (
            f"{binary} is not installed: the fleet needs HAProxy {MIN_HAPROXY[0]}.{MIN_HAPROXY[1]} or newer "
            "(Debian and Ubuntu: apt-get install haproxy; `make test-tools` does it when run as root)"
        )
    shown = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"version (\d+)\.(\d+)", shown)
    if found is None or (int(found[1]), int(found[2])) < MIN_HAPROXY:
        first = shown.splitlines()[0] if shown else "no version"
        return f"{path} says {first!r}: the fleet needs HAProxy {MIN_HAPROXY[0]}.{MIN_HAPROXY[1]} or newer"
    return None


def with_servers(config: str, servers: Sequence[tuple[str, str]]) -> str:
    """`config` with its `server` lines replaced by one per (name, host:port), where the first one stood."""
    lines = config.splitlines()
    found = [i for i, line in enumerate(lines) if line.split()[:1] == ["server"]]
    if not found:
        raise ValueError("the HAProxy config has no `server` line to replace")
    first = lines[found[0]]
    indent = first[: len(first) - len(first.lstrip())]
    kept = [line for i, line in enumerate(lines) if i not in found]
    new = [f"{indent}server {name} {address}" for name, address in servers]
    return "\n".join(kept[: found[0]] + new + kept[found[0] :]) + "\n"


class Fleet:
    """`replicas` onepass servers, each with `server_args`, ready, and haproxy in front; `url` is haproxy's.

    `echo(name, line)` gets every log line of every process as it comes (the command shows them)."""

    def __init__(
        self,
        replicas: int,
        server_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        config: Path = HAPROXY_CONFIG,
        haproxy: str = "haproxy",
        timeout: float = 300,
        echo: Callable[[str, str], None] | None = None,
    ) -> None:
        self.replicas: dict[str, ServerProcess] = {}
        self.haproxy: LoggedProcess | None = None
        self._folder = tempfile.TemporaryDirectory(prefix="onepass-fleet-")
        listener = listening_socket(host, port, backlog=1024)
        self.url = url_of(listener)
        try:
            names = [f"replica{i}" for i in range(1, replicas + 1)]
            # The first starts alone: what a server measures once per machine and caches (app/platform/tuning.py,
            # repacked weights) it measures with the CPU to itself, and the others then read it.
            self._start_replicas(names[:1], server_args, timeout, echo)
            self._start_replicas(names[1:], server_args, timeout, echo)
            self.config = Path(self._folder.name) / "haproxy.cfg"
            servers = [(name, urlsplit(server.url).netloc) for name, server in self.replicas.items()]
            self.config.write_text(with_servers(config.read_text(), servers))
            self._start_haproxy(haproxy, listener, echo)
        except BaseException:
            self.stop()
            raise
        finally:
            listener.close()  # haproxy holds its own copy: when it exits, clients are refused, not left waiting

    def _start_replicas(
        self, names: list[str], args: Sequence[str], timeout: float, echo: Callable[[str, str], None] | None
    ) -> None:
        def start(name: str) -> ServerProcess:
            shown = None if echo is None else (lambda line: echo(name, line))
            return ServerProcess([*args, "--replica-name", name], timeout=timeout, echo=shown)

        if not names:
            return
        pool = ThreadPoolExecutor(len(names))  # each start runs the build check: in parallel
        started = {name: pool.submit(start, name) for name in names}
        pool.shutdown(wait=False)
        try:
            wait(started.values())
        finally:
            wait(started.values())  # again when interrupted (Ctrl-C, SIGTERM): what started must be stopped
            self.replicas.update({name: future.result() for name, future in started.items() if not future.exception()})
        failures = [future.exception() for future in started.values() if future.exception() is not None]
        if failures:
            raise RuntimeError(f"{len(failures)} of {len(names)} replicas did not start: {failures[0]}")
        for name in names:
            server = self.replicas[name]
            if LOAD_FAILED in server.wait_for(f"{READY}|{LOAD_FAILED}", timeout):
                raise RuntimeError(f"{name} could not load its model; its log ends: {server.lines[-8:]}")

    def _start_haproxy(self, haproxy: str, listener: socket.socket, echo: Callable[[str, str], None] | None) -> None:
        env = {**os.environ, BIND_ENV: f"fd@{listener.fileno()}"}
        fds = [listener.fileno()]
        argv = [haproxy, "-f", str(self.config)]
        checked = subprocess.run([*argv, "-c"], env=env, pass_fds=fds, capture_output=True, text=True, timeout=60)
        if checked.returncode != 0:
            raise RuntimeError(f"haproxy rejected {self.config}:\n{checked.stdout}{checked.stderr}")
        shown = None if echo is None else (lambda line: echo("haproxy", line))
        self.haproxy = LoggedProcess([*argv, "-db"], env, shown, pass_fds=fds, name="haproxy")

    def stop(self) -> None:
        """haproxy first (no new requests reach a replica that is stopping), then every replica at once."""
        if self.haproxy is not None:
            self.haproxy.stop(30)
        with ThreadPoolExecutor(max(1, len(self.replicas))) as pool:
            list(pool.map(lambda server: server.stop(), self.replicas.values()))
        self._folder.cleanup()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    ours, server_args = (given[: given.index("--")], given[given.index("--") + 1 :]) if "--" in given else (given, [])
    parser = argparse.ArgumentParser(
        prog="python -m app.fleet.supervisor",
        description="N onepass replicas behind HAProxy, routed by state. Flags after -- go to every replica.",
    )
    parser.add_argument("--replicas", type=int, default=3, help="how many onepass servers (default 3)")
    parser.add_argument("--host", default="127.0.0.1", help="address haproxy listens on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port haproxy listens on (0: any free port)")
    parser.add_argument("--config", type=Path, default=HAPROXY_CONFIG, help="HAProxy config whose server lines to fill")
    parser.add_argument("--haproxy", default="haproxy", help="the haproxy program")
    args = parser.parse_args(ours)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    problem = haproxy_problem(args.haproxy)
    if problem is not None:
        sys.exit(f"onepass fleet: {problem}")

    def show(name: str, line: str) -> None:
        sys.stderr.write(f"{name:>9} | {line}\n")  # the replicas log haproxy's health checks at debug only

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(0)  # unwinds through the fleet's __exit__, which stops everything

    signal.signal(signal.SIGTERM, terminate)
    try:
        with Fleet(args.replicas, server_args, args.host, args.port, args.config, args.haproxy, echo=show) as fleet:
            for name, server in fleet.replicas.items():
                log.info("%s: %s (pid %d)", name, server.url, server.pid)
            log.info("fleet ready: %s routes by state to %d replicas; Ctrl-C stops it", fleet.url, len(fleet.replicas))
            assert fleet.haproxy is not None
            code = fleet.haproxy.process.wait()  # until Ctrl-C or SIGTERM
        sys.exit(f"onepass fleet: haproxy exited ({code}); the replicas were stopped")
    except KeyboardInterrupt:
        log.info("stopped")


if __name__ == "__main__":
    main()
