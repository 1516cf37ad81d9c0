"""The models served: GET /v1/models, loading and unloading one, GET /v1/cache (each loaded model's tiers)."""

from __future__ import annotations

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse

from app.http.runtime import runtime_of
from app.serving.catalogue import models_listing


async def list_models(request: Request) -> JSONResponse:
    return JSONResponse(models_listing(runtime_of(request).require_registry().catalogue()))


async def load_model_route(request: Request) -> JSONResponse:
    runtime = runtime_of(request)
    name = runtime.canonical(request.path_params["name"])
    registry = runtime.require_registry()
    await anyio.to_thread.run_sync(registry.load, name)
    return JSONResponse({"name": name, "loaded": True})


async def unload_model_route(request: Request) -> JSONResponse:
    runtime = runtime_of(request)
    name = runtime.canonical(request.path_params["name"])
    registry = runtime.require_registry()
    # in a worker thread: closing a model frees llama.cpp's memory and waits for its disk tier's writes
    unloaded = await anyio.to_thread.run_sync(registry.unload, name)
    return JSONResponse({"name": name, "unloaded": unloaded})


async def cache_stats(request: Request) -> JSONResponse:
    registry = runtime_of(request).require_registry()
    models = {}
    for name, service in registry.loaded().items():
        tiers = service.cache_stats()
        models[name] = {**tiers["state"], "question_set": tiers["question_set"], "disk": tiers["disk"]}
    return JSONResponse(models)
