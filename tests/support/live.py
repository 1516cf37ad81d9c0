"""A real uvicorn server on a loopback port, in a thread, for clients that need a socket.

The socket is bound and listening before the thread starts, so clients can connect at once:
connections wait in the backlog until uvicorn accepts them (no polling, no sleeps). And a
wait for a running server's background snapshot writes, shared by the disk and fleet tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import uvicorn

from app.config import Settings
from app.fleet.processes import listening_socket, url_of
from app.http.server import create_app, default_loader
from app.labelling.session import LabellingFiles
from app.serving.registry import ModelRegistry


class RunningServer:
    """Serving `registry`; without one, the app loads its own with `loader` in the background. With
    `labelling`, a labelling session on those files (as `onepass label` serves)."""

    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry | None = None,
        loader: Callable[[Settings], ModelRegistry] = default_loader,
        labelling: LabellingFiles | None = None,
    ) -> None:
        self.sock = listening_socket("127.0.0.1", 0, backlog=64)
        self.base_url = url_of(self.sock)
        config = uvicorn.Config(
            create_app(settings, registry, loader, labelling=labelling), log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
        assert not self.thread.is_alive(), "uvicorn did not shut down"


def wait_for_disk_writes(url: str, model: str = "tiny-chat", timeout: float = 120) -> None:
    """Until the server at `url` has no snapshot write queued for `model`: its disk tier writes in
    the background, and a response is sent once its snapshot is queued. The server publishes no
    event for it, so its stats are read until the count is 0, within `timeout`."""
    deadline = time.monotonic() + timeout
    while httpx.get(url + "/v1/cache", timeout=timeout).json()[model]["disk"]["queued"]:
        assert time.monotonic() < deadline, "the background writes did not finish"
        threading.Event().wait(0.05)
