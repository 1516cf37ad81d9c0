"""What the routes share (settings, models, admission, API keys, fitting and batch jobs), yielded by the lifespan."""

from __future__ import annotations

import hmac
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request

from app.config import Settings
from app.config_sources import ConfigError, SettingsSource, reload_settings
from app.errors import ApiError, ModelNotFound
from app.fitting.jobs import FitWork
from app.http.admission import Admission, Place
from app.http.batch_jobs import BatchWork
from app.jobs import JobRegistry
from app.labelling.session import LabellingSession
from app.serving.registry import ModelRegistry
from app.serving.specs import read_models_config
from app.wire.images import IMAGES_BODY_BYTES

log = logging.getLogger("onepass.server")


def read_api_keys(settings: Settings) -> tuple[bytes, ...]:
    keys = [settings.api_key] if settings.api_key else []
    if settings.api_key_file is not None:
        lines = settings.api_key_file.read_text(encoding="utf-8").splitlines()
        keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return tuple(key.encode() for key in keys)


@dataclass
class Runtime:
    """What the routes share; yielded by the lifespan as request.state.runtime."""

    settings: Settings
    source: SettingsSource | None = None  # the argv and environment the settings came from, for reloads
    registry: ModelRegistry | None = None
    names: dict[str, str] | None = None  # the configured names (ModelsConfig.names), known before any model loads
    load_error: str | None = None
    loaded: threading.Event = field(default_factory=threading.Event)
    api_keys: tuple[bytes, ...] = ()
    admission: Admission = field(default_factory=Admission)  # per model: requests admitted, not yet answered
    # The worker threads of answers (a request's, a batch's in its response): a limiter of their own, not
    # anyio's default one, which parses bodies and checks requests. Admission bounds them already, so an
    # answer never waits for a thread, and answers waiting for a context never keep a request for an idle
    # model, or one a 404, 422 or 503 answers, from being read.
    answers: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(math.inf))
    fit_jobs: JobRegistry[FitWork] = field(default_factory=lambda: JobRegistry("fitting"))
    batch_jobs: JobRegistry[BatchWork] = field(default_factory=lambda: JobRegistry("batch"))
    labelling: LabellingSession | None = None  # `onepass label`'s session, once the model is loaded

    def accepts(self, authorization: bytes) -> bool:
        """Whether an Authorization header's value lets a request in (any value while auth is off)."""
        if not self.api_keys:
            return True  # auth off: an Authorization header is accepted and ignored
        scheme, _, token = authorization.partition(b" ")
        offered = token.strip()
        # compare with every key, in constant time each, so timing says nothing about which matched
        matched = [hmac.compare_digest(offered, key) for key in self.api_keys]
        return scheme.lower() == b"bearer" and any(matched)

    def admit(self, name: str, contexts: int) -> Place:
        """A place among the requests one model is serving (its `contexts`) or queueing; 503 when full.

        Per model: each model has its own pool of contexts, so a busy model does not turn
        requests for an idle one away."""
        return self.admission.take(name, contexts + self.settings.max_queue)

    def reload(self) -> dict[str, list[str]]:
        """Read the settings again from the same sources (SIGHUP, POST /v1/config/reload) and apply
        them: the models, limits, keys (a server started with -m alone reloads its flags' files, the
        API key file). A bad file changes nothing."""
        registry = self.require_registry()
        if self.source is None:
            raise ApiError(400, "invalid_config", "this server was built without settings sources: nothing to reload")
        try:
            reloaded = reload_settings(self.settings, self.source)
            models = read_models_config(reloaded.settings)
            api_keys = read_api_keys(reloaded.settings)
        except (ConfigError, ValueError, OSError) as error:
            raise ApiError(
                400, "invalid_config", f"config rejected, still serving the previous one: {error}"
            ) from error
        changes = registry.reload(models)
        changed = list(reloaded.changed)
        if api_keys != self.api_keys and not {"api_key", "api_key_file"} & set(changed):
            changed.append("api_key_file")  # the same file with other keys in it: a rotation took effect
        self.settings, self.api_keys = reloaded.settings, api_keys
        report = {**changes, "settings_changed": changed, "needs_restart": reloaded.needs_restart}
        log.info("config reloaded: %s", report)
        return report

    def body_limit(self) -> int:
        """The largest body read: max_body_bytes, plus room for the largest images a request may carry
        as base64 where a model served takes images."""
        vision = self.registry is not None and bool(self.registry.vision_models())
        return self.settings.max_body_bytes + (IMAGES_BODY_BYTES if vision else 0)

    def canonical(self, name: str) -> str:
        """The configured model `name` means: ModelNotFound (404) for a name no model has, also while the
        models load or after they failed to (when the configured names are known)."""
        if self.registry is not None:
            return self.registry.canonical(name)
        if self.names is not None and name not in self.names:
            raise ModelNotFound(name, list(self.names))
        return self.require_registry().canonical(name)

    def require_registry(self) -> ModelRegistry:
        if self.registry is not None:
            return self.registry
        if self.load_error is not None:
            raise ApiError(503, "overloaded", f"the model failed to load: {self.load_error}", {"Retry-After": "60"})
        raise ApiError(503, "overloaded", "the model is still loading", {"Retry-After": "5"})

    def metric_sources(self) -> dict[str, Any]:
        models = {}
        if self.registry is not None:
            for name, service in self.registry.loaded().items():
                in_flight = self.admission.held(name)
                models[name] = {
                    "tiers": service.cache_stats(),
                    "prefilled_tokens": service.prefilled_tokens,
                    "busy_seconds": service.engine.busy_seconds(),
                    "waits": service.engine.waits(),
                    "decoded": service.engine.decoded(),
                    "shared_decodes": service.engine.shared_decodes(),
                    "in_flight": in_flight,
                    "queue_depth": max(0, in_flight - self.registry.contexts_of(name)),
                }
        return {"models": models}


def runtime_of(request: Request) -> Runtime:
    runtime: Runtime = request.state.runtime
    return runtime
