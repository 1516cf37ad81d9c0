"""The servers the examples are sent to: the app on a config file in a folder, through Starlette's test
client, its request log lines kept; and the gate that holds a job at a chosen request, so that a page
can show it part-way whatever the speed of the machine."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.config import Settings
from app.config_sources import SettingsSource
from app.engine.caller import current
from app.http.server import create_app
from app.labelling.session import LabellingFiles
from app.serving.registry import ModelRegistry
from app.serving.specs import read_models_config
from app.wire.contract import SystemOneRequest

WAIT_S = 120.0  # for a job to end, a model to load: a bound, never reached when things work
REPLICA = "docs:8080"

CONFIG = """[server]
threads = 1
repack = "off"
flash_attn = "off"
calibration_dir = "cal"
session_cache_dir = "snap"
{server}
[[models]]
name = "tiny"
path = "tiny.gguf"
{models}"""


class Gate:
    """An intercept on the registry (app/serving/registry.py) that stops before chosen leases, counted
    from `arm`: a job is caught with a known number of requests answered, whatever the speed of the
    machine. A batch job leases its model once for each request; a fitting job once for its run."""

    def __init__(self) -> None:
        self.arm({})

    def arm(self, holds: dict[int, threading.Event | None]) -> None:
        """Stop before the n-th lease until its event is set (None: until that request is cancelled)."""
        self.leased, self.holds = 0, holds
        self.reached = {n: threading.Event() for n in holds}

    def __call__(self, service: ModelService, request: SystemOneRequest | None) -> None:
        self.leased += 1
        if self.leased in self.holds:
            self.reached[self.leased].set()
            until = self.holds[self.leased] or (current().stop if request is not None else None)
            assert until is not None, "a hold until cancelled, for work that cannot be cancelled"
            until.wait(WAIT_S)


@dataclass
class Server:
    """The app on the config in `folder`, its responses and its request log lines."""

    folder: Path
    settings: dict[str, Any] = field(default_factory=dict)  # on top of the config file
    labelling: LabellingFiles | None = None  # `onepass label`'s session
    gate: Gate = field(default_factory=Gate)
    logged: list[dict[str, Any]] = field(default_factory=list)

    def loader(self, settings: Settings) -> ModelRegistry:
        return ModelRegistry(read_models_config(settings), intercept=self.gate)

    @contextlib.contextmanager
    def running(self) -> Iterator[TestClient]:
        source = SettingsSource(("--config", str(self.folder / "onepass.toml")), {}, None)
        settings = dataclasses.replace(source.load(), **self.settings)
        app = create_app(settings, loader=self.loader, source=source, replica=REPLICA, labelling=self.labelling)
        handler = _Lines(self.logged)
        requests = logging.getLogger("onepass.requests")
        level = requests.level
        requests.addHandler(handler)
        requests.setLevel(logging.INFO)
        requests.propagate = False  # kept, not printed
        try:
            with TestClient(app, raise_server_exceptions=False) as client:
                assert runtime(app).loaded.wait(WAIT_S), "the model did not load"
                yield client
        finally:
            requests.removeHandler(handler)
            requests.setLevel(level)
            requests.propagate = True


class _Lines(logging.Handler):
    def __init__(self, lines: list[dict[str, Any]]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


def runtime(app: Any) -> Any:
    return app.state.runtime


def write_config(folder: Path, server: str = "", models: str = "") -> None:
    """The config file: CONFIG with `server` lines in [server] and `models` lines after tiny's path (keys
    of tiny's own, or more entries)."""
    (folder / "onepass.toml").write_text(CONFIG.format(server=server, models=models), encoding="utf-8")


def job_thread(client: TestClient, registry: str, job_id: str) -> threading.Thread:
    jobs = getattr(runtime(client.app), registry)
    thread: threading.Thread | None = jobs.get(job_id).thread
    assert thread is not None
    return thread
