"""States files for the labelling tests, and waiting for a session's jobs (each wait bounded)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from app.labelling.session import LabellingSession

TEAM = {"type": "choice", "instructions": "Which team?", "criteria": {"Alpha": None, "Beta": None, "Gamma": None}}
URGENT = {"type": "noul", "instructions": "Is it urgent?"}
SIZE = {"type": "score", "instructions": "How long is it?", "criteria": ["short", "medium", "long"]}
QUESTIONS = {"team": TEAM, "urgent": URGENT}
WAIT_S = 180.0


def right(i: int) -> dict[str, Any]:
    """State i's right answers: Alpha eight times in ten (Beta and Gamma once each), urgent once in ten,
    whatever the state says: a bias a fit learns from few labels, every label seen."""
    return {"team": {3: "Beta", 7: "Gamma"}.get(i % 10, "Alpha"), "urgent": i % 10 == 5}


def state(i: int) -> dict[str, Any]:
    return {"state": f"Ticket {i}: " + " ".join(f"word{(i * 13 + j) % 89}" for j in range(12)), "questions": QUESTIONS}


def write_states(path: Path, n: int, labelled: int = 0) -> Path:
    """n states, the first `labelled` with their answers; a blank line after the third (lines count it)."""
    lines = [json.dumps({**state(i), **({"answers": right(i)} if i < labelled else {})}) for i in range(n)]
    path.write_text("\n".join([*lines[:3], "", *lines[3:]]) + "\n", encoding="utf-8")
    return path


def line_of(i: int) -> int:
    """State i's line in a file write_states wrote."""
    return i + 1 if i < 3 else i + 2


def index_of(line: int) -> int:
    return line - 1 if line <= 3 else line - 2


def answered(session: LabellingSession, timeout: float = WAIT_S) -> None:
    assert session.answering is not None
    session.answering.thread.join(timeout)
    assert session.answering.status == "done", session.answering.error
    assert session.ready


def settled(session: LabellingSession, timeout: float = WAIT_S) -> None:
    """Until no refit runs or waits to run, each job waited for within what is left of `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        job = session.refit
        if job is None:
            return
        job.thread.join(max(0.0, deadline - time.monotonic()))
        assert not job.thread.is_alive(), "a refit did not end in time"
        if session.refit is job and not session.refitting:
            return
