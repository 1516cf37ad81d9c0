"""docs/api.md's examples, made by the real server: the Starlette app on a tiny model with random weights,
asked each example's request in turn; each example's region of the page (between `<!-- api-example: NAME -->`
and `<!-- /api-example -->`) is the request as a curl command and what came back.

    .venv/bin/python -m tools.api_examples            # exits 1 and says which differ, where the page is stale
    .venv/bin/python -m tools.api_examples --write    # writes them into docs/api.md (make api-examples)

The server's folder is shown as /tmp/apidoc. What differs from run to run is left out of the comparison
(`normalised`): every number with a fraction or an exponent (timings, probabilities, scores: a model with
random weights, and rounding that depends on the CPU) and every run of 16 or more hex digits (job and fit
ids, content keys).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import difflib
import json
import logging
import re
import shlex
import struct
import sys
import tempfile
import threading
import zlib
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
from app.labelling.labels import LabelsFile, labels_path
from app.labelling.session import LabellingFiles, read_states
from app.paths import REPO_ROOT
from app.platform.tiny_gguf import write_tiny_gguf
from app.serving.registry import ModelRegistry
from app.serving.specs import read_models_config
from app.wire.contract import SystemOneRequest

PAGE = REPO_ROOT / "docs" / "api.md"
SHOWN_FOLDER = "/tmp/apidoc"
REGION = re.compile(r"(<!-- api-example: ([\w-]+) -->\n)(.*?)(<!-- /api-example -->)", re.DOTALL)
WAIT_S = 120.0  # for a job to end, a model to load: a bound, never reached when things work
REPLICA = "docs:8080"
# Characters a line of JSON takes, numbers and ids counted as placeholders, before its items go one a line
# (FLAT_WIDTH: an object or array of plain values, such as timings, kept whole for longer).
WIDTH = 110
FLAT_WIDTH = 160

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

REFUND = {"type": "noul", "instructions": "Does the customer ask for money back?"}
TICKET: dict[str, Any] = {
    "model": "jev-latest",
    "state": "I was charged twice for March and want my money back.",
    "questions": {
        "refund": REFUND,
        "team": {
            "type": "choice",
            "instructions": "Which team handles it?",
            "criteria": {"Billing": "Payments and refunds", "Technical": None},
        },
        "anger": {
            "type": "score",
            "instructions": "How frustrated is the customer?",
            "criteria": ["Calm", "Annoyed", "Furious"],
        },
    },
}
BATCH: dict[str, Any] = {
    "requests": [
        {"model": "jev-latest", "state": "I was charged twice for March.", "questions": {"refund": REFUND}},
        {"model": "jev-latest", "state": "My parcel never arrived.", "questions": {"refund": {"type": "maybe"}}},
        {"model": "gpt-5", "state": "Hello?", "questions": {"q": {"type": "noul"}}},
        {
            "model": "jev-latest",
            "state": "I was charged twice for March.",
            "questions": {"team": {"type": "choice", "criteria": {"Billing": None, "Shipping": None}}},
        },
    ]
}


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def red_pixel() -> bytes:
    """A 1 x 1 red PNG, its pixel data a stored zlib block: the same bytes whatever zlib this is."""
    row = b"\x00\xff\x00\x00"  # filter 0, then red
    stored = (
        b"\x78\x01\x01" + struct.pack("<HH", len(row), 0xFFFF ^ len(row)) + row + struct.pack(">I", zlib.adler32(row))
    )
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", stored) + png_chunk(b"IEND", b"")


PARCEL = {"damaged": {"type": "noul", "instructions": "Is the parcel in <photo> damaged?"}}
BOUNDARY = "------------------------d74496d66958873e"  # curl's kind of boundary


def curl_form(fields: list[tuple[str, str, str, bytes]]) -> tuple[str, bytes]:
    """What `curl -F name=@file;type=...` sends for (name, file name, type, bytes) each: its Content-Type and body."""
    body = b""
    for name, filename, kind, data in fields:
        disposition = f'Content-Disposition: form-data; name="{name}"; filename="{filename}"'
        body += f"--{BOUNDARY}\r\n{disposition}\r\nContent-Type: {kind}\r\n\r\n".encode() + data + b"\r\n"
    return f"multipart/form-data; boundary={BOUNDARY}", body + f"--{BOUNDARY}--\r\n".encode()


def ticket(n: int, model: str = "jev-latest") -> dict[str, Any]:
    return {"model": model, "state": f"Ticket {n}: my parcel is late.", "questions": {"refund": REFUND}}


def example(n: int) -> dict[str, Any]:
    """A labelled example for fitting: the even ones ask for a refund."""
    state = f"Ticket {n}: I want a refund for order {n}." if n % 2 else f"Ticket {n}: How do I reset my password?"
    return {"state": state, "questions": {"refund": REFUND}, "answers": {"refund": bool(n % 2)}}


# ---------------------------------------------------------------------------------------------------
# Text as the page shows it


def layout(value: Any, indent: int = 0, before: int = 0) -> str:
    """JSON as the page shows it: a value on one line where it fits in WIDTH (`before`: the characters
    ahead of it on its line), else one item a line. Measured as `normalised`, so that the lines break at
    the same places whatever the digits of a run."""
    compact = json.dumps(value, ensure_ascii=False)
    items = list(value.values() if isinstance(value, dict) else value) if isinstance(value, dict | list) else []
    width = WIDTH if any(isinstance(item, dict | list) for item in items) else FLAT_WIDTH
    if not items or 2 * indent + before + len(normalised(compact)) <= width:
        return compact
    pad = "  " * (indent + 1)
    if isinstance(value, dict):
        keys = {k: json.dumps(k, ensure_ascii=False) + ": " for k in value}
        items = [pad + keys[k] + layout(v, indent + 1, len(keys[k])) for k, v in value.items()]
    else:
        items = [pad + layout(v, indent + 1) for v in value]
    opening, closing = "{}" if isinstance(value, dict) else "[]"
    return opening + "\n" + ",\n".join(items) + "\n" + "  " * indent + closing


def block(text: str, kind: str = "") -> str:
    return f"```{kind}\n{text}\n```\n"


def blocks(*parts: str) -> str:
    """Code blocks and lines of text, a blank line between each two."""
    return "\n".join(parts)


def curl(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None, *, show: bool = False) -> str:
    """The request as a curl command (`show`: -i, the status line and headers too)."""
    words = ["curl -s" + (" -i" if show else "")]
    if method not in ("GET", "POST") or (method == "POST" and body is None):
        words.append(f"-X {method}")
    words.append(shlex.quote(f"localhost:8080{path}"))
    words += [f"-H {shlex.quote(f'{name}: {value}')}" for name, value in (headers or {}).items()]
    if isinstance(body, str):
        words.append(f"--data-binary @{body}")
    elif body is not None:
        words.append("-d '" + layout(body).replace("'", "'\\''") + "'")
    return " ".join(words)


def head(response: Any) -> str:
    """The status line and the headers, as curl -i shows them (the length aside: it follows the numbers)."""
    lines = [f"HTTP/1.1 {response.status_code} {response.reason_phrase}"]
    lines += [f"{name}: {value}" for name, value in response.headers.items() if name != "content-length"]
    return "\n".join(lines)


def clipped(value: Any, keep: int = 3) -> Any:
    """`value` with every array of more than `keep` + 1 items cut to its first `keep` and "..."."""
    if isinstance(value, dict):
        return {k: clipped(v, keep) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) <= keep + 1:
            return [clipped(v, keep) for v in value]
        return [*(clipped(v, keep) for v in value[:keep]), "..."]
    return value


def shortened(job: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """A batch job with only the results at `keep`."""
    return {**job, "results": [job["results"][i] for i in keep]}


# ---------------------------------------------------------------------------------------------------
# The servers


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
    (folder / "onepass.toml").write_text(CONFIG.format(server=server, models=models), encoding="utf-8")


def job_thread(client: TestClient, registry: str, job_id: str) -> threading.Thread:
    jobs = getattr(runtime(client.app), registry)
    thread: threading.Thread | None = jobs.get(job_id).thread
    assert thread is not None
    return thread


# ---------------------------------------------------------------------------------------------------
# The examples


def examples(folder: Path) -> dict[str, str]:
    """Each example's region text, from a run of the server in `folder`."""
    write_tiny_gguf(folder / "tiny.gguf", seed=0)
    write_config(folder)
    shown: dict[str, str] = {}
    server = Server(folder)
    with server.running() as client:
        _answers(client, shown)
        _images(client, shown)
        _batches(client, server, shown)
        _calibrations(client, server, shown)
        _models(client, shown)  # after the gated ones: it unloads the model, which loads again
        _reload(client, folder, shown)
    write_config(folder)
    own_disk = {"session_cache_dir": folder / "snap-restart"}  # a disk tier holding this request's snapshots only
    with Server(folder, own_disk).running() as client:
        client.post("/v1/systemone", json=TICKET)  # its snapshot is on disk once the server has stopped
    restarted = Server(folder, own_disk)
    with restarted.running() as client:  # a restart: the first request finds its snapshot on the disk tier
        _restarted(client, restarted, shown)
    _auth(folder, shown)
    _health(folder, shown)
    _labelling(folder, shown)
    return {name: text.replace(str(folder), SHOWN_FOLDER) for name, text in shown.items()}


def json_block(value: Any) -> str:
    return block(layout(value), "json")


def _answers(client: TestClient, shown: dict[str, str]) -> None:
    headers = {"Content-Type": "application/json", "X-Request-Id": "7f3a-docs"}
    first = client.post("/v1/systemone", json=TICKET, headers=headers)
    shown["answer"] = blocks(
        block(curl("POST", "/v1/systemone", TICKET, headers)), block(head(first)), json_block(first.json())
    )
    again = client.post("/v1/systemone", json=TICKET).json()
    assert again["answers"] == first.json()["answers"]
    shown["answer-again"] = (
        "The same request again is answered from the cache, with the same numbers:\n"
        f'`"x_cache": {json.dumps(again["x_cache"])}`, `"x_timing_ms": {json.dumps(again["x_timing_ms"])}`.\n'
    )


def _images(client: TestClient, shown: dict[str, str]) -> None:
    image = {"type": "image", "format": "png", "data_base64": base64.b64encode(red_pixel()).decode()}
    body = {"model": "jev-latest", "state": "A parcel: <photo>", "questions": PARCEL, "assets": {"<photo>": image}}
    inline = client.post("/v1/systemone", json=body)
    assert inline.status_code == 422, inline.text
    parted = {**body, "assets": {"<photo>": {"type": "image", "part": "asset-0"}}}
    content_type, form = curl_form(
        [
            ("request", "request.json", "application/json", json.dumps(parted).encode()),
            ("asset-0", "parcel.png", "image/png", red_pixel()),
        ]
    )
    sent = client.post("/v1/systemone", content=form, headers={"Content-Type": content_type})
    assert sent.json() == inline.json(), sent.text
    command = (
        "curl -s localhost:8080/v1/systemone -F 'request=@request.json;type=application/json' -F 'asset-0=@parcel.png'"
    )
    shown["images"] = blocks(
        "An image as base64 in the JSON body:\n",
        block(curl("POST", "/v1/systemone", body)),
        "or as the SDK sends it, a part of a multipart body (`request.json`: the same request, its asset "
        '`{"type": "image", "part": "asset-0"}`; `parcel.png`: the image), answered alike:\n',
        block(command),
        json_block(inline.json()),
    )


def _batches(client: TestClient, server: Server, shown: dict[str, str]) -> None:
    headers = {"X-Request-Id": "batch-docs"}
    answered = client.post("/v1/systemone", json=BATCH, headers=headers)
    shown["batch"] = blocks(block(curl("POST", "/v1/systemone", BATCH, headers)), json_block(answered.json()))
    gate, resume = server.gate, threading.Event()
    gate.arm({1: resume, 124: None})  # nothing answered when the 202 is sent; caught at 123, until cancelled
    headers = {"X-Request-Id": "job-docs"}
    started = client.post("/v1/systemone", json={"requests": [ticket(n) for n in range(300)]}, headers=headers)
    assert gate.reached[1].wait(WAIT_S), "the job never reached its first request"
    resume.set()
    job_id = started.json()["id"]
    shown["batch-job"] = blocks(
        block(curl("POST", "/v1/systemone", "tickets.json", headers, show=True)),
        "(`tickets.json`: 300 requests, each like the first one above about another ticket.)\n",
        block(head(started)),
        json_block(started.json()),
    )
    assert gate.reached[124].wait(WAIT_S), "the job never reached its 124th request"
    path = f"/v1/systemone/jobs/{job_id}"
    shown["batch-job-running"] = blocks(block(curl("GET", path)), json_block(client.get(path).json()))
    cancelled = client.delete(path).json()
    gate.arm({})
    count = cancelled["done"]
    shown["batch-job-cancelled"] = blocks(
        block(curl("DELETE", path)),
        json_block(shortened(cancelled, [0, -1])),
        f"(`results` shortened to the first and the last of 300: {count} answers, then {300 - count} `null`.)\n",
    )
    twenty = [ticket(n, "gpt-5" if n == 307 else "jev-latest") for n in range(300, 320)]  # new states: misses
    done_id = client.post("/v1/systemone", json={"requests": twenty}).json()["id"]
    job_thread(client, "batch_jobs", done_id).join(WAIT_S)
    done = client.get(f"/v1/systemone/jobs/{done_id}").json()
    shown["batch-job-done"] = blocks(
        "and once it is done (`results` shortened to two of its twenty):\n", json_block(shortened(done, [0, 7]))
    )


def _models(client: TestClient, shown: dict[str, str]) -> None:
    shown["models"] = blocks(block(curl("GET", "/v1/models")), json_block(client.get("/v1/models").json()))
    loaded = client.post("/v1/models/tiny/load").json()
    shown["load"] = blocks(block(curl("POST", "/v1/models/tiny/load")), json_block(loaded))
    unloaded = client.post("/v1/models/jev-latest/unload").json()
    shown["unload"] = blocks(block(curl("POST", "/v1/models/jev-latest/unload")), json_block(unloaded))


def _calibrations(client: TestClient, server: Server, shown: dict[str, str]) -> None:
    body = {"model": "jev-latest", "examples": [example(n) for n in range(1, 13)]}
    headers = {"Content-Type": "application/json", "X-Request-Id": "fit-docs"}
    gate, resume = server.gate, threading.Event()
    gate.arm({1: resume})  # nothing answered when the 202 is sent
    started = client.post("/v1/calibrations", json=body, headers=headers)
    assert gate.reached[1].wait(WAIT_S), "the fitting job never reached its first example"
    resume.set()
    job = started.json()
    shown["fit-start"] = blocks(
        block(curl("POST", "/v1/calibrations", body, headers, show=True)), block(head(started)), json_block(job)
    )
    job_thread(client, "fit_jobs", job["id"]).join(WAIT_S)
    path = f"/v1/calibrations/jobs/{job['id']}"
    report = client.get(path).json()
    for entry in report["report"] or []:
        entry["candidates"] = dict(list(entry["candidates"].items())[:5])
    shown["fit-job"] = blocks(
        block(curl("GET", path)),
        json_block(report),
        "(`candidates` shortened to five; the server lists every candidate tried, each with its cross-validated "
        "log loss.)\n",
    )
    fits = client.get("/v1/calibrations?model=tiny").json()
    records = [{**record, "fit": clipped(record["fit"])} for record in fits["fits"]]
    shown["fits"] = blocks(
        block(curl("GET", "/v1/calibrations?model=tiny")),
        json_block({**fits, "fits": records}),
        '(The fit\'s vectors shortened to their first three numbers, then "...".)\n',
    )
    asked = {"model": "jev-latest", "state": example(13)["state"], "questions": {"refund": REFUND}}
    answer = client.post("/v1/systemone", json=asked).json()["answers"]["refund"]
    shown["fit-answer"] = blocks("An answer that used a fit:\n", json_block(answer))
    fit_id = fits["fits"][0]["id"]
    deleted = client.delete(f"/v1/calibrations/{fit_id}?model=tiny").json()
    shown["fit-delete"] = blocks(block(curl("DELETE", f"/v1/calibrations/{fit_id}?model=tiny")), json_block(deleted))


def _labelling(folder: Path, shown: dict[str, str]) -> None:
    """`onepass label states.jsonl`: two states, the first labelled in the file, so that which state
    comes next does not depend on the model's numbers."""
    states = folder / "states.jsonl"
    lines = [example(1), {k: v for k, v in example(2).items() if k != "answers"}]
    states.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    files = LabellingFiles(read_states(states), LabelsFile(labels_path(states)))
    with Server(folder, labelling=files).running() as client:
        session = runtime(client.app).labelling
        session.answering.thread.join(WAIT_S)
        offered = client.get("/v1/labelling/next?count=5").json()
        shown["label-next"] = blocks(block(curl("GET", "/v1/labelling/next?count=5")), json_block(offered))
        body = {"state": 2, "answers": {"refund": False}}
        stored = client.post("/v1/labelling/labels", json=body).json()
        shown["label-post"] = blocks(block(curl("POST", "/v1/labelling/labels", body)), json_block(stored))
        refused = client.post("/v1/labelling/labels", json={"state": 2, "answers": {"refund": "no"}}).json()
        shown["label-422"] = blocks("A label the question cannot take stores nothing:\n", json_block(refused))
        session.refit.thread.join(WAIT_S)
        shown["label-session"] = blocks(
            block(curl("GET", "/v1/labelling")), json_block(client.get("/v1/labelling").json())
        )
    with Server(folder).running() as client:
        shown["label-404"] = json_block(client.get("/v1/labelling").json())


def _reload(client: TestClient, folder: Path, shown: dict[str, str]) -> None:
    added = '\n[[models]]\nname = "tiny2"\npath = "tiny.gguf"\n'
    write_config(folder, "max_questions = 128\nmax_text_chars = 10000\n", added)
    reloaded = client.post("/v1/config/reload").json()
    shown["reload"] = blocks(block(curl("POST", "/v1/config/reload")), json_block(reloaded))
    (folder / "onepass.toml").write_text("[server]\nmax_questions = \n", encoding="utf-8")
    refused = client.post("/v1/config/reload")
    assert refused.status_code == 400
    shown["reload-refused"] = blocks(
        "A config file with an error changes nothing and gets 400 `invalid_config`:\n", json_block(refused.json())
    )


# The lines of /metrics the page shows: the state tier, the requests' route, the model's gauges.
SHOWN_METRICS = re.compile(
    r'onepass_(requests_total\{route="/v1/systemone"|request_seconds_(count|sum)\{cache="disk"'
    r'|queue_depth|in_flight|cache_(entries|tokens|bytes|hits_total|misses_total)\{model="tiny",tier="state"'
    r"|prefilled_tokens_total)"
)
OPENAPI_PATHS = (
    "curl -s localhost:8080/openapi.json"
    " | python3 -c 'import json, sys; print(sorted(json.load(sys.stdin)[\"paths\"]))'"
)


def _restarted(client: TestClient, server: Server, shown: dict[str, str]) -> None:
    answered = client.post("/v1/systemone", json=TICKET, headers={"X-Request-Id": "doc-2"})
    assert answered.json()["x_cache"] == "disk", "the restarted server did not find the snapshot on disk"
    line = next(line for line in server.logged if line["request_id"] == "doc-2")
    shown["log-line"] = block(json.dumps(line))
    shown["cache"] = blocks(block(curl("GET", "/v1/cache")), json_block(client.get("/v1/cache").json()))
    metrics = [line for line in client.get("/metrics").text.splitlines() if SHOWN_METRICS.match(line)]
    shown["metrics"] = blocks(block(curl("GET", "/metrics")), block("\n".join(metrics)))
    paths = sorted(client.get("/openapi.json").json()["paths"])
    shown["openapi"] = blocks(block(OPENAPI_PATHS), block(repr(paths)))
    bad = {**TICKET, "questions": {"q": {"type": "choice", "criteria": {"A": None}}}}
    shown["error-422"] = json_block(client.post("/v1/systemone", json=bad).json())
    shown["error-404"] = json_block(client.post("/v1/systemone", json={**TICKET, "model": "nope"}).json())


def _auth(folder: Path, shown: dict[str, str]) -> None:
    with Server(folder, {"api_key": "secret"}).running() as client:
        refused = client.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    command = curl("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
    shown["auth"] = block(f"$ {command}\n{refused.text}")


def _health(folder: Path, shown: dict[str, str]) -> None:
    release = threading.Event()
    server = Server(folder)

    def slow(settings: Settings) -> ModelRegistry:
        release.wait(WAIT_S)
        return server.loader(settings)

    source = SettingsSource(("--config", str(folder / "onepass.toml")), {}, None)
    loading = create_app(source.load(), loader=slow, source=source, replica=REPLICA)
    with TestClient(loading) as client:
        while_loading = client.get("/health")
        release.set()
        assert runtime(loading).loaded.wait(WAIT_S)
        ready = client.get("/health")
    (folder / "junk.gguf").write_bytes(b"not a model")
    junk_config = CONFIG.format(server="", models="").replace('"tiny"', '"junk"').replace("tiny.gguf", "junk.gguf")
    (folder / "junk.toml").write_text(junk_config, encoding="utf-8")
    junk = SettingsSource(("--config", str(folder / "junk.toml")), {}, None)
    failing = create_app(junk.load(), source=junk, replica=REPLICA)
    quiet = logging.getLogger("onepass")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the load fails on purpose: no traceback
    with TestClient(failing) as client:
        assert runtime(failing).loaded.wait(WAIT_S)
        failed = client.get("/health")
    quiet.setLevel(level)
    rows = [
        (ready, "(the default model)"),
        (while_loading, "while it loads"),
        (failed, "if it failed; restart after fixing it"),
    ]
    shown["health"] = "| status | body |\n|---|---|\n" + "".join(
        f"| {r.status_code} | `{json.dumps(r.json())}` {note} |\n" for r, note in rows
    )


# ---------------------------------------------------------------------------------------------------
# The page


def regions(page: str) -> dict[str, str]:
    return {found[2]: found[3] for found in REGION.finditer(page)}


def with_examples(page: str, made: dict[str, str]) -> str:
    """The page with each region's text replaced by the example made for it."""
    missing = set(regions(page)) - set(made)
    assert not missing, f"no example is made for {sorted(missing)}"
    return REGION.sub(lambda found: found[1] + "\n" + made[found[2]] + "\n" + found[4], page)


NUMBER_WITH_FRACTION = re.compile(r"(?<![\w.])-?\d+(?:\.\d+(?:e[-+]?\d+)?|e[-+]?\d+)(?![\w.])")
HEX_ID = re.compile(r"(?<![\w.])[0-9a-f]{16,}(?![\w.])")


def normalised(text: str) -> str:
    """What is the same from run to run: hex ids and numbers with a fraction or an exponent, as placeholders."""
    return NUMBER_WITH_FRACTION.sub("<number>", HEX_ID.sub("<hex>", text))


def stale(page: str, made: dict[str, str]) -> list[str]:
    """The lines that differ, normalised, between the page and the page with the examples made now."""
    fresh = with_examples(page, made)
    return list(
        difflib.unified_diff(
            normalised(page).splitlines(), normalised(fresh).splitlines(), "docs/api.md", "made now", lineterm="", n=1
        )
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.api_examples", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the examples into docs/api.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="apidoc-") as folder:
        made = examples(Path(folder).resolve())
    page = PAGE.read_text(encoding="utf-8")
    if args.write:
        PAGE.write_text(with_examples(page, made), encoding="utf-8")
        print(f"{len(regions(page))} examples written to {PAGE.relative_to(REPO_ROOT)}")
        return
    differ = stale(page, made)
    if differ:
        print("\n".join(differ))
        sys.exit("docs/api.md's examples are not what the server answers now: make api-examples")
    print(f"docs/api.md: its {len(regions(page))} examples are what the server answers")


if __name__ == "__main__":
    main()
