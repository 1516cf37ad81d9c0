"""The server's own routes: health probes, config reload, Prometheus metrics, the OpenAPI document."""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.http.runtime import runtime_of


async def health(request: Request) -> JSONResponse:
    runtime = runtime_of(request)
    if runtime.registry is None:
        status = "loading" if runtime.load_error is None else "failed"
        return JSONResponse({"status": status, "error": runtime.load_error}, status_code=503)
    return JSONResponse({"status": "ok", "model": runtime.registry.default_name})


async def health_live(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def reload_config(request: Request) -> JSONResponse:
    changes = await anyio.to_thread.run_sync(runtime_of(request).reload)
    return JSONResponse({"reloaded": True, **changes})


async def openapi_json(request: Request) -> JSONResponse:
    return JSONResponse(request.app.state.openapi)


async def metrics_text(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type="text/plain; version=0.0.4")
