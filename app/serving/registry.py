"""The model registry: which models are resident. Leases, loading on first use, LRU unloading, reload.

A request leases its model: the lease loads it if needed and keeps it resident until the
request is done, so a model is never unloaded under an in-flight request. Beyond
`models_max` resident models the least recently used idle one is unloaded. A reload swaps
in a new configuration; models it drops or changes retire once idle.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Self

from app.answering.service import ModelService
from app.engine.caller import Caller, Signal, current, working_for
from app.errors import InvalidRequest, ModelNotFound, ModelUnavailable
from app.serving.catalogue import CatalogueEntry
from app.serving.loading import load_spec
from app.serving.specs import ModelsConfig, ModelSpec
from app.wire.contract import SystemOneRequest, SystemOneResponse, validation_error

log = logging.getLogger("onepass.models")

# Runs as a lease begins, in the thread that takes it, with the model lent and the request it is lent to
# answer (None: a lease for more than one answer, a fitting run's). It may wait or raise. The one way in
# for whoever must hold work at a known point or plant a fault (the tests, docs/api.md's examples),
# without copying a ModelService or reaching into it.
Intercept = Callable[[ModelService, SystemOneRequest | None], None]


@dataclass
class _Resident:
    service: ModelService
    spec: ModelSpec
    busy: int = 0
    retiring: bool = False  # unloaded from the registry; closes when its last request ends


@dataclass
class _Offered:
    """What the registry offers: its configuration, its models by name, every name and alias."""

    config: ModelsConfig
    specs: dict[str, ModelSpec] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # name or alias -> model name


class ModelRegistry:
    def __init__(
        self,
        config: ModelsConfig,
        loader: Callable[[ModelSpec], ModelService] = load_spec,
        intercept: Intercept | None = None,
    ) -> None:
        self._loader = loader
        self._intercept = intercept
        self._cond = threading.Condition()
        self._resident: OrderedDict[str, _Resident] = OrderedDict()  # least recently used first
        self._loading: set[str] = set()
        self._errors: dict[str, str] = {}
        self._decision_types: dict[str, str | None] = {}  # learnt at each model's load (its GGUF's metadata)
        self._offered = self._index(config)
        self._closed = False  # once closed, no model loads again (a thread outliving shutdown gets a 503)

    @classmethod
    def serving(cls, service: ModelService, spec: ModelSpec | None = None, intercept: Intercept | None = None) -> Self:
        """A registry around one already loaded model (tests, embedding)."""
        spec = spec or ModelSpec(service.name, service.engine.path)
        registry = cls(ModelsConfig((spec,), spec.name, 1), loader=lambda _: service, intercept=intercept)
        registry.load(spec.name)
        return registry

    @staticmethod
    def _index(config: ModelsConfig) -> _Offered:
        return _Offered(config, {spec.name: spec for spec in config.models}, config.names())

    @property
    def default_name(self) -> str:
        return self._offered.config.default_model

    def canonical(self, name: str) -> str:
        try:
            return self._offered.names[name]
        except KeyError:
            raise ModelNotFound(name, list(self._offered.names)) from None

    def contexts_of(self, name: str) -> int:
        """How many requests the model decodes at once (its pool of llama.cpp contexts)."""
        return self._offered.specs[self.canonical(name)].settings.contexts

    def batches_requests(self, name: str) -> bool:
        """Whether the model decodes the questions of requests that wait at once together (batch_requests)."""
        return self._offered.specs[self.canonical(name)].settings.batch_requests

    def spec_of(self, name: str) -> ModelSpec:
        """The model's configuration (what is known of it without loading it)."""
        return self._offered.specs[self.canonical(name)]

    @contextmanager
    def lease(self, name: str, request: SystemOneRequest | None = None) -> Iterator[ModelService]:
        """The model, loaded and kept resident for as long as the caller holds it (to answer `request`, if
        given). ModelUnavailable (503) once the registry is closed."""
        resident = self._acquire(self.canonical(name))
        assert resident is not None  # _acquire loads
        try:
            if self._intercept is not None:
                self._intercept(resident.service, request)
            yield resident.service
        finally:
            self._release(resident)

    @contextmanager
    def lease_if_loaded(self, name: str) -> Iterator[ModelService | None]:
        """The model kept resident while the caller holds it, if it is loaded now; else None, and nothing
        is loaded (nor evicted to make room)."""
        resident = self._acquire(self.canonical(name), load=False)
        try:
            yield None if resident is None else resident.service
        finally:
            if resident is not None:
                self._release(resident)

    def load(self, name: str) -> None:
        with self.lease(name):
            pass

    def unload(self, name: str) -> bool:
        """Unload now, or as soon as its in-flight requests end. False if it was not loaded."""
        return self._retire(self.canonical(name))

    def reload(self, config: ModelsConfig) -> dict[str, list[str]]:
        """Adopt a new configuration; removed and changed models retire once idle."""
        offered = self._index(config)
        with self._cond:
            old = self._offered.specs
            changed = [name for name, spec in old.items() if offered.specs.get(name) not in (None, spec)]
            removed = [name for name in old if name not in offered.specs]
            self._offered = offered
            retiring = [name for name in (*changed, *removed) if name in self._resident]
        for name in retiring:
            self._retire(name)
        self._evict_idle()
        return {"added": [n for n in offered.specs if n not in old], "removed": removed, "changed": changed}

    def answer(self, name: str, request: SystemOneRequest, cancelled: Signal | None = None) -> SystemOneResponse:
        """The model's answer, in the lane of the current caller; `cancelled` (a timeout, a client gone)
        stops it at the next step of its work, the wait for a model to load included."""
        self._check_images(name, request)
        caller = current() if cancelled is None else Caller(current().lane, cancelled)
        with working_for(caller):
            caller.check("the model was leased")
            with self.lease(name, request) as service:
                return service.answer(request)

    def vision_models(self) -> list[str]:
        """The configured models that take images."""
        return [spec.name for spec in self._offered.config.models if spec.takes_images]

    def _check_images(self, name: str, request: SystemOneRequest) -> None:
        """A 422 for images sent to a model that does not take them, naming the models that do."""
        media, model = request.media, self.canonical(name)
        if not media.images or self._offered.specs[model].takes_images:
            return
        vision = self.vision_models()
        others = f"the models here that do: {', '.join(vision)}" if vision else "no model here takes images"
        message = f"image assets need a vision model; {model!r} has no vision projector, and {others}"
        raise InvalidRequest(validation_error((media.fields[0],), message, "images_unsupported", len(media.images)))

    def check(self, name: str, request: SystemOneRequest) -> None:
        """Raise the request's 422 (images to a model without vision; a prompt its context cannot hold,
        more options than labels) or 413 (more prompt tokens than the model's max_prompt_tokens) without
        answering it. A model not loaded yet cannot tokenize: its prompt is checked once it is, when the
        request is answered."""
        self._check_images(name, request)
        with self._cond:
            resident = self._resident.get(self.canonical(name))
            if resident is None:
                return
            resident.busy += 1  # not unloaded while we plan
        try:
            resident.service.plan(request)
        finally:
            self._release(resident)

    def loaded(self) -> dict[str, ModelService]:
        """The resident models by their configured name."""
        with self._cond:
            return {name: resident.service for name, resident in self._resident.items()}

    def catalogue(self) -> list[CatalogueEntry]:
        """Every name a client may ask for (aliases too), the model it means, and whether it is loaded."""
        with self._cond:
            offered, loaded, errors = self._offered, set(self._resident), dict(self._errors)
            decision_types = dict(self._decision_types)
        return [
            CatalogueEntry(
                name,
                model,
                offered.specs[model].path.name,
                {**offered.specs[model].describe(), "known_model": offered.specs[model].known},
                model in loaded,
                errors.get(model),
                decision_types.get(model),
                offered.specs[model].takes_images,
            )
            for name, model in offered.names.items()
        ]

    def close(self) -> None:
        """Close every resident model, for good: a later lease raises ModelUnavailable instead of loading a
        model again, and a load under way is closed when it ends. A model still leased (a job's thread that
        outlived shutdown) closes when its last lease ends, never under it."""
        with self._cond:
            self._closed = True
            names = list(self._resident)
            self._cond.notify_all()  # leases waiting for a load in flight: they raise now
        for name in names:
            self._retire(name)

    def _unavailable(self, name: str) -> ModelUnavailable:
        return ModelUnavailable(f"model {name!r} is not available: the server is shutting down")

    def _acquire(self, name: str, load: bool = True) -> _Resident | None:
        """The model's resident entry, one more request counted on it; loaded first if it is not (None
        instead when not `load`)."""
        caller = current()
        with caller.stop.waking(self._wake), self._cond:
            while name in self._loading and not self._closed:
                caller.check("the model was loaded")
                self._cond.wait()  # woken when the load ends, or by the caller's stop
            if self._closed:
                raise self._unavailable(name)
            resident = self._resident.get(name)
            if resident is not None:
                self._resident.move_to_end(name)
                resident.busy += 1
                return resident
            if not load:
                return None
            spec = self._offered.specs[name]
            self._loading.add(name)
        try:
            service = self._loader(spec)
        except Exception as error:
            with self._cond:
                self._loading.discard(name)
                self._errors[name] = str(error)
                self._cond.notify_all()
            log.error("loading %s failed: %s", name, error)
            raise ModelUnavailable(f"model {name!r} could not be loaded: {error}") from error
        with self._cond:
            self._loading.discard(name)
            self._cond.notify_all()
            closed = self._closed
            if not closed:
                self._errors.pop(name, None)
                self._decision_types[name] = service.prompter.decision_type
                resident = self._resident[name] = _Resident(service, spec, busy=1)
        if closed:  # closed while it loaded: nobody may use it
            service.close()
            raise self._unavailable(name)
        self._evict_idle()
        return resident

    def _wake(self) -> None:
        """Wake the requests waiting for a load: one's stop was set."""
        with self._cond:
            self._cond.notify_all()

    def _release(self, resident: _Resident) -> None:
        with self._cond:
            resident.busy -= 1
            closing = resident.retiring and resident.busy == 0
        if closing:
            self._close(resident)
        self._evict_idle()

    def _retire(self, name: str) -> bool:
        """Take a model out of residence; it closes now if idle, else when its last request ends."""
        with self._cond:
            resident = self._resident.pop(name, None)
            if resident is None:
                return False
            resident.retiring = True
            closing = resident.busy == 0
        if closing:
            self._close(resident)
        return True

    def _evict_idle(self) -> None:
        """Unload least recently used idle models while more than models_max are resident."""
        while True:
            with self._cond:
                excess = len(self._resident) - self._offered.config.models_max
                # never the most recently used: it is the one a request just asked for
                idle = [name for name, r in list(self._resident.items())[:-1] if r.busy == 0]
                if excess <= 0 or not idle:
                    return
                victim = self._resident.pop(idle[0])
                victim.retiring = True
            log.info("unloading %s (models_max=%d)", idle[0], self._offered.config.models_max)
            self._close(victim)

    @staticmethod
    def _close(resident: _Resident) -> None:
        resident.service.close()
