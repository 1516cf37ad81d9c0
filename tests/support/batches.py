"""Batches for the tests of POST /v1/systemone with {"requests": [...]}: ticket-like requests, and each
item's result as it must be, the one its request gets alone."""

from __future__ import annotations

import json
from typing import Any

from starlette.testclient import TestClient

from app.http.runtime import Runtime
from app.paths import REPO_ROOT

TICKET: dict[str, Any] = json.loads((REPO_ROOT / "examples" / "ticket.json").read_text())

SUBJECTS = ["charged twice", "parcel lost", "app crashes", "password reset", "refund late", "rude agent", "wrong size"]

URGENT = {"type": "noul", "instructions": "Is it urgent?"}

WAIT = 30  # seconds: every wait in these tests is bounded


def ticket(i: int, subject: str | None = None, **changes: Any) -> dict[str, Any]:
    """A ticket-like request; tickets i and i + 7 share their state (the 50 tickets have 7 states)."""
    subject = subject or SUBJECTS[i % len(SUBJECTS)]
    questions = TICKET["questions"] if i % 5 else {**TICKET["questions"], "urgent": URGENT}
    return {"model": "jev-latest", "state": f"Ticket about {subject}: please help.", "questions": questions, **changes}


def comparable(response: dict[str, Any]) -> dict[str, Any]:
    """What must be the same bit for bit whatever else the server answered: all but the cache and timings."""
    return {key: value for key, value in response.items() if key not in ("x_cache", "x_timing_ms")}


def alone(client: TestClient, body: Any) -> dict[str, Any]:
    """The item's result as the batch must give it: what the request gets alone."""
    response = client.post("/v1/systemone", json=body)
    if response.status_code == 200:
        return comparable(response.json())
    return {"error": {"status": response.status_code, "detail": response.json()["detail"]}}


def settled(result: dict[str, Any] | None) -> dict[str, Any] | None:
    return result if result is None or "error" in result else comparable(result)


def runtime_of(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.runtime  # type: ignore[attr-defined]
    return runtime


def batch(client: TestClient, requests: Any) -> Any:
    return client.post("/v1/systemone", json={"requests": requests})
