"""The examples docs/api.md shows, each asked of a running server: which requests, in which order and on
which server, and what of the answers each region shows. A region's text comes from the server's
answers to that example's requests; `examples` makes them all."""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from pathlib import Path

from starlette.testclient import TestClient

from app.config import Settings
from app.config_sources import SettingsSource
from app.http.server import create_app
from app.labelling.labels import LabelsFile, labels_path
from app.labelling.session import LabellingFiles, read_states
from app.platform.tiny_gguf import write_tiny_gguf
from app.platform.tiny_images import png
from app.platform.tiny_projector import write_tiny_mmproj
from app.serving.registry import ModelRegistry
from tools.api_examples.bodies import BATCH, PARCEL, REFUND, TICKET, example, ticket
from tools.api_examples.harness import CONFIG, REPLICA, WAIT_S, Server, job_thread, runtime, write_config
from tools.api_examples.render import block, blocks, clipped, curl, curl_form, head, json_block, shortened

SHOWN_FOLDER = "/tmp/apidoc"


def examples(folder: Path) -> dict[str, str]:
    """Each example's region text, from a run of the server in `folder`."""
    write_tiny_gguf(folder / "tiny.gguf", seed=0)
    write_config(folder)
    shown: dict[str, str] = {}
    server = Server(folder)
    with server.running() as client:
        _answers(client, shown)
        _batches(client, server, shown)
        _calibrations(client, server, shown)
        _models(client, shown)  # after the gated ones: it unloads the model, which loads again
        _reload(client, folder, shown)
    _images(folder, shown)
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


# The images example's server: the tiny model with a tiny projector of random weights, which libmtmd
# loads beside it, so that the page shows an answer about an image (its numbers mean nothing).
VISION = 'mmproj = "tiny-mmproj.gguf"\n'


def _images(folder: Path, shown: dict[str, str]) -> None:
    write_tiny_mmproj(folder / "tiny-mmproj.gguf", "mlp", seed=0)
    write_config(folder, models=VISION)
    photo = png(1, 1, compressed=False)  # stored pixel data: its base64 is the same on every machine
    image = {"type": "image", "format": "png", "data_base64": base64.b64encode(photo).decode()}
    body = {"model": "jev-latest", "state": "A parcel: <photo>", "questions": PARCEL, "assets": {"<photo>": image}}
    parted = {**body, "assets": {"<photo>": {"type": "image", "part": "asset-0"}}}
    content_type, form = curl_form(
        [
            ("request", "request.json", "application/json", json.dumps(parted).encode()),
            ("asset-0", "parcel.png", "image/png", photo),
        ]
    )
    with Server(folder).running() as client:
        inline = client.post("/v1/systemone", json=body)
        assert inline.status_code == 200, inline.text
        sent = client.post("/v1/systemone", content=form, headers={"Content-Type": content_type})
    assert sent.status_code == 200, sent.text
    assert sent.json()["answers"] == inline.json()["answers"], "the multipart body was answered otherwise"
    assert sent.json()["x_cache"] == "hit", "the same image state, sent as a part, was not found in the cache"
    command = (
        "curl -s localhost:8080/v1/systemone -F 'request=@request.json;type=application/json' -F 'asset-0=@parcel.png'"
    )
    shown["images"] = blocks(
        "An image as base64 in the JSON body:\n",
        block(curl("POST", "/v1/systemone", body)),
        "or as the SDK sends it, a part of a multipart body (`request.json`: the same request, its asset "
        '`{"type": "image", "part": "asset-0"}`; `parcel.png`: the image), answered alike (the second time '
        'from the cache, `"x_cache": "hit"`). The answer, from the tiny model served with a tiny projector '
        '(`mmproj = "tiny-mmproj.gguf"` in its entry), both of random weights:\n',
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
