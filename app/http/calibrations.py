"""/v1/calibrations: fitting jobs started from a user's examples, and the fits a model keeps."""

from __future__ import annotations

import contextlib

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.answering.service import ModelService
from app.calibration import FitStore
from app.errors import ApiError, InvalidRequest
from app.fitting.examples import ExampleError, parse_examples
from app.fitting.jobs import FitWork, calibration_job_of
from app.http.body import parse_json, read_body
from app.http.runtime import runtime_of
from app.serving.specs import DEFAULT_ALIAS


async def start_fitting(request: Request) -> JSONResponse:
    """POST /v1/calibrations: fit calibrations to the examples in the body, as a background job."""
    runtime = runtime_of(request)
    payload = parse_json(await read_body(request, runtime.settings.max_body_bytes))
    if not isinstance(payload, dict) or not isinstance(payload.get("examples"), list):
        raise InvalidRequest.at(("examples",), "a list of examples is required", "missing", None)
    question_set = payload.get("question_set", False)
    if not isinstance(question_set, bool):
        raise InvalidRequest.at(("question_set",), "true or false", "bool_type", question_set)
    name = runtime.canonical(str(payload.get("model", DEFAULT_ALIAS)))
    try:
        examples = parse_examples(payload["examples"])
    except ExampleError as error:
        raise InvalidRequest.at(("examples",), str(error), "value_error", None) from error
    registry = runtime.require_registry()

    def lease() -> contextlib.AbstractContextManager[ModelService]:
        return registry.lease(name)

    job = runtime.fit_jobs.start(FitWork(name, lease, examples, question_set))
    location = {"Location": f"/v1/calibrations/jobs/{job.id}"}
    return JSONResponse(calibration_job_of(job).wire(), status_code=202, headers=location)


async def fitting_job(request: Request) -> JSONResponse:
    job = runtime_of(request).fit_jobs.get(request.path_params["id"])
    if job is None:
        raise ApiError(404, "not_found", f"no fitting job {request.path_params['id']!r}")
    return JSONResponse(calibration_job_of(job).wire())


def _fits_of(request: Request) -> tuple[str, FitStore]:
    runtime = runtime_of(request)
    name = runtime.canonical(request.query_params.get("model", DEFAULT_ALIAS))
    registry = runtime.require_registry()
    with registry.lease(name) as service:
        store = service.calibration.store
        if store is None:
            raise ApiError(404, "not_found", f"{name} keeps no fits")
        return name, store


async def list_fits(request: Request) -> JSONResponse:
    name, fits = await anyio.to_thread.run_sync(_fits_of, request)
    shown = [record.to_json() for record in fits.records()]
    return JSONResponse({"model": name, "fits": shown})


async def delete_fit(request: Request) -> JSONResponse:
    name, fits = await anyio.to_thread.run_sync(_fits_of, request)
    if not fits.delete(request.path_params["id"]):
        raise ApiError(404, "not_found", f"{name} has no fit {request.path_params['id']!r}")
    return JSONResponse({"model": name, "deleted": request.path_params["id"]})
