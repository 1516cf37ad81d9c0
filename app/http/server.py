"""The app: create_app puts routes, page, middlewares and error mapping together; the lifespan loads the models."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware

from app.answering.service import ModelService
from app.config import Settings
from app.config_sources import ConfigError, SettingsSource, package_version
from app.errors import ApiError
from app.fleet.routing import REPLICA_HEADER, replica_name
from app.http.errors import EXCEPTION_HANDLERS
from app.http.middleware import PUBLIC_PATHS, ContainInternalErrors, RequireApiKey
from app.http.observability import Metrics, RequestObserver
from app.http.openapi import build_openapi
from app.http.page import Page
from app.http.routes import API_ROUTES
from app.http.runtime import Runtime, read_api_keys
from app.labelling.session import LabellingFiles, LabellingSession
from app.serving.registry import ModelRegistry
from app.serving.specs import read_models_config

log = logging.getLogger("onepass.server")


def _watch_sighup(loop: asyncio.AbstractEventLoop, runtime: Runtime) -> bool:
    """Reload the config on SIGHUP (only possible when the loop runs in the main thread)."""

    def reload_logged() -> None:
        try:
            runtime.reload()
        except ApiError as error:
            log.error("SIGHUP reload: %s", error.message)

    try:
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, reload_logged))
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


def default_loader(settings: Settings) -> ModelRegistry:
    registry = ModelRegistry(read_models_config(settings))
    registry.load(registry.default_name)  # the default model loads at startup, others on first use
    return registry


def _configured_names(settings: Settings) -> dict[str, str] | None:
    """The names the models config offers, read before any model loads: an unknown name gets its 404 while
    they load. None when the config cannot be read (the load then fails and says why)."""
    try:
        return read_models_config(settings).names()
    except (ConfigError, ValueError, OSError):
        return None


def _start_labelling(runtime: Runtime, files: LabellingFiles | None) -> None:
    """The labelling session on the default model, answering its states as a job (once the models are loaded)."""
    registry = runtime.registry
    if files is None or registry is None:
        return
    name = registry.default_name

    def lease() -> contextlib.AbstractContextManager[ModelService]:
        return registry.lease(name)

    runtime.labelling = LabellingSession(files.states, files.labels, name, lease, runtime.fit_jobs)
    runtime.labelling.start()


def _lifespan(
    settings: Settings,
    source: SettingsSource | None,
    registry: ModelRegistry | None,
    loader: Callable[[Settings], ModelRegistry],
    labelling: LabellingFiles | None = None,
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[dict[str, Any]]]:
    """Start: the runtime, and the models loading in the background unless `registry` is given, then
    the labelling session if there is one. Stop: fitting and batch jobs cancelled, the models closed."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        runtime = Runtime(settings, source, registry, api_keys=read_api_keys(settings))
        app.state.runtime = runtime  # for the metrics, and for tests and embedders to wait on
        thread = None
        if registry is None:
            runtime.names = _configured_names(settings)

            def load_in_background() -> None:
                try:
                    runtime.registry = loader(settings)
                    log.info("ready: serving %s", runtime.registry.default_name)
                    _start_labelling(runtime, labelling)
                except Exception as error:
                    log.exception("loading the model failed")
                    runtime.load_error = str(error)
                finally:
                    runtime.loaded.set()

            thread = threading.Thread(target=load_in_background, name="onepass-load", daemon=True)
            thread.start()
        else:
            _start_labelling(runtime, labelling)
            runtime.loaded.set()
        loop = asyncio.get_running_loop()
        hangup = _watch_sighup(loop, runtime)
        try:
            yield {"runtime": runtime}
        finally:
            if hangup:
                loop.remove_signal_handler(signal.SIGHUP)
            if runtime.labelling is not None:
                runtime.labelling.close()  # no refit starts after this
            # every job of both kinds stops side by side, within one shutdown_timeout
            runtime.fit_jobs.stop_all()
            runtime.batch_jobs.stop_all()
            deadline = time.monotonic() + settings.shutdown_timeout
            runtime.fit_jobs.join_all(deadline)
            runtime.batch_jobs.join_all(deadline)
            if thread is not None:
                thread.join()
                if runtime.registry is not None:
                    runtime.registry.close()

    return lifespan


def _metric_sources(app: Starlette) -> dict[str, Any]:
    runtime: Runtime | None = getattr(app.state, "runtime", None)  # set by the lifespan
    return runtime.metric_sources() if runtime is not None else {}


def create_app(
    settings: Settings,
    registry: ModelRegistry | None = None,
    loader: Callable[[Settings], ModelRegistry] = default_loader,
    source: SettingsSource | None = None,
    replica: str | None = None,
    labelling: LabellingFiles | None = None,
) -> Starlette:
    """The app. With `registry` it serves that; otherwise the lifespan loads one in the background.

    `source` (where `settings` were read from) lets SIGHUP and POST /v1/config/reload read them again.
    `replica` names this server in every response's X-Onepass-Replica (default: --replica-name, else the
    host name; the CLI adds the port). `labelling`: the states and labels files `onepass label` serves.
    """
    replica = replica or replica_name(settings.replica_name)
    page = None if settings.no_ui else Page()
    public = PUBLIC_PATHS | (page.paths if page is not None else set())
    metrics = Metrics(lambda: _metric_sources(app))  # read after `app` exists: on a scrape
    app = Starlette(
        routes=API_ROUTES if page is None else [*API_ROUTES, page],
        middleware=[
            Middleware(RequestObserver, metrics=metrics, headers={REPLICA_HEADER: replica}),
            Middleware(ContainInternalErrors),
            Middleware(RequireApiKey, public=frozenset(public)),
        ],
        lifespan=_lifespan(settings, source, registry, loader, labelling),
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.openapi = build_openapi(package_version())
    app.state.metrics = metrics
    return app
