"""/v1/labelling: the labelling session `onepass label S.jsonl` serves (app/labelling/session.py): its
progress and figures, the next states to label with their current answers, and storing a label."""

from __future__ import annotations

import re
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.answering.service import answer_from
from app.errors import ApiError, InvalidRequest
from app.fitting.jobs import FitWork
from app.http.body import read_request
from app.http.runtime import runtime_of
from app.jobs import BackgroundJob
from app.labelling.session import LabellingSession

MOST_NEXT = 50  # states one GET /v1/labelling/next may ask for
# A whole number in ASCII digits: str.isdigit also takes digits int() refuses ("²"), and int() refuses
# more than a few thousand of them.
WHOLE = re.compile(r"[0-9]{1,9}")
IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg"}


def _session(request: Request) -> LabellingSession:
    session = runtime_of(request).labelling
    if session is None:
        raise ApiError(
            404, "not_found", "this server has no labelling session: start one with `onepass label STATES.jsonl`"
        )
    return session


def _job(job: BackgroundJob[FitWork] | None) -> dict[str, Any] | None:
    if job is None:
        return None
    progress = job.work.progress
    shown = {"id": job.id, "status": job.status, "done": progress.done, "total": progress.total}
    return shown | {"reused": job.work.reused, "eta_s": job.eta_s(), "error": job.error}


def _overview(session: LabellingSession) -> dict[str, Any]:
    labelled = session.labelled()
    return {
        "model": session.model,
        "states_file": str(session.states.path),
        "labels_file": str(session.labels.path),
        "states": len(session.order),
        "labelled": len(labelled),
        "coverage": session.coverage,
        "answering": _job(session.answering),
        "refit": _job(session.refit),
        "refit_pending": session.refit_pending,
        "questions": session.questions(session.coverage, labelled),
        "warnings": session.warnings,
    }


async def labelling(request: Request) -> JSONResponse:
    """GET /v1/labelling: the session's progress, labels and per-question figures."""
    session = _session(request)
    return JSONResponse(await anyio.to_thread.run_sync(_overview, session))


def _images(item: dict[str, Any]) -> list[str]:
    """The state's images as data URLs, as the states file gives them (Jev's assets, llama.cpp's URLs)."""
    urls = [url for field in ("files", "images") for url in item.get(field) or [] if isinstance(url, str)]
    for asset in (item.get("assets") or {}).values():
        if isinstance(asset, dict) and isinstance(asset.get("data_base64"), str):
            kind = IMAGE_TYPES.get(str(asset.get("format")), "image/png")
            urls.append(f"data:{kind};base64,{asset['data_base64']}")
    return urls


def _state(session: LabellingSession, n: int) -> dict[str, Any]:
    item = session.states.items[n]
    questions = session.states.examples[n].request.questions
    found, masses = session.answers(n), session.masses(n)
    return {
        "state": n,
        "text": item["state"],
        "questions": item["questions"],
        "images": _images(item),
        "answers": {
            qid: answer_from(questions[qid], found[qid], masses.get(qid)).model_dump(mode="json", exclude_none=True)
            for qid in questions
            if qid in found
        },
    }


def _count(request: Request) -> int:
    given = request.query_params.get("count", "1")
    if not WHOLE.fullmatch(given) or not 1 <= int(given) <= MOST_NEXT:
        detail = {"loc": ["query", "count"], "msg": f"a whole number from 1 to {MOST_NEXT}", "type": "value_error"}
        raise InvalidRequest([{**detail, "input": given}])
    return int(given)


def _skipped(request: Request, session: LabellingSession) -> set[int]:
    """The states the page passed over (`skip=3,7,12`: their lines), left out of the queue: the page
    cannot filter them out of a queue capped at MOST_NEXT once they fill its top."""
    given = request.query_params.get("skip", "")
    lines = given.split(",") if given else []
    if not all(WHOLE.fullmatch(line) and int(line) in session.states.items for line in lines):
        message = f"states' lines in {session.states.path.name}, comma-separated"
        detail = {"loc": ["query", "skip"], "msg": message, "type": "value_error"}
        raise InvalidRequest([{**detail, "input": given}])
    return {int(line) for line in lines}


def _next(session: LabellingSession, count: int, skipped: set[int]) -> dict[str, Any]:
    if not session.ready:
        job = session.answering
        if job is not None and job.status not in ("running", "done"):
            raise ApiError(503, "overloaded", f"answering the states {job.status}: {job.error or 'see the log'}")
        done = "" if job is None else f": {job.work.progress.done} of {job.work.progress.total}"
        raise ApiError(503, "overloaded", f"the states are still being answered{done}", {"Retry-After": "2"})
    ranked = session.ranked(count, skipped)
    return {"states": [_state(session, n) for n in ranked], "labelled": len(session.labelled())}


async def next_states(request: Request) -> JSONResponse:
    """GET /v1/labelling/next?count=N&skip=LINES: the next states to label, best first, with their current
    answers, none of the states skipped."""
    session, count = _session(request), _count(request)
    skipped = _skipped(request, session)
    return JSONResponse(await anyio.to_thread.run_sync(_next, session, count, skipped))


def _label(session: LabellingSession, payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InvalidRequest.at((), 'an object: {"state": line, "answers": {...}}', "dict_type", payload)
    try:
        line, refit = session.label(payload.get("state"), payload.get("answers"))
    except OSError as error:  # the file could not be written: the label is not stored
        raise ApiError(500, "internal_error", f"could not write {session.labels.path}: {error}") from error
    return {"stored": line, "labelled": len(session.labelled()), "refit": refit}


async def store_label(request: Request) -> JSONResponse:
    """POST /v1/labelling/labels {"state": line, "answers": {...}}: answered once the label is on disk."""
    session = _session(request)
    limit = runtime_of(request).settings.max_body_bytes
    return JSONResponse(await read_request(request, limit, lambda payload, _: _label(session, payload)))
