"""Request ids, one structured log line per request, and Prometheus metrics (GET /metrics).

`RequestObserver` is a plain ASGI middleware: it assigns or echoes X-Request-Id, times the
request, counts it by route and status, and logs one JSON line with what the handler put
in `scope["state"]["observed"]` (model, questions, tokens, cache, timings).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# ASGI's types, spelled out: RequestObserver is plain ASGI and needs no framework.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("onepass.requests")
PROBE_ROUTES = ("/health", "/health/live")

REQUEST_ID = "x-request-id"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """One registry per app, so several apps in one process (tests) never share counters."""

    def __init__(self, sources: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("onepass_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.latency = Histogram(
            "onepass_request_seconds",
            "request latency by cache outcome",
            ["route", "cache"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Sources(sources))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Sources(Collector):
    """Gauges and counters read at scrape time from the live objects (cache stats, queue)."""

    def __init__(self, sources: Callable[[], dict[str, Any]]) -> None:
        self._sources = sources

    def collect(self) -> Iterable[Metric]:
        found = self._sources()
        requests = {
            "queue_depth": GaugeMetricFamily(
                "onepass_queue_depth", "requests waiting for one of the model's contexts", labels=["model"]
            ),
            "in_flight": GaugeMetricFamily("onepass_in_flight", "requests being answered or waiting", labels=["model"]),
        }
        # tier: "state" (system + state snapshots in RAM), "question_set" (the question-first
        # layout's) or "disk" (state snapshots on disk); a disk tier that is off reports nothing.
        gauges = {
            name: GaugeMetricFamily(f"onepass_cache_{name}", f"session cache {name}", labels=["model", "tier"])
            for name in ("entries", "tokens", "bytes")
        }
        counters = {
            name: CounterMetricFamily(f"onepass_cache_{name}", f"session cache {name}", labels=["model", "tier"])
            for name in ("hits", "misses", "evictions", "writes", "writes_skipped")
        }
        rejected = CounterMetricFamily(
            "onepass_cache_disk_rejected", "snapshot files deleted on read, by reason", labels=["model", "reason"]
        )
        prefilled = CounterMetricFamily("onepass_prefilled_tokens", "state tokens prefilled", labels=["model"])
        busy = CounterMetricFamily(
            "onepass_context_busy_seconds",
            "time the model's contexts were lent to work, answered or abandoned, by lane",
            labels=["model", "lane"],
        )
        waiting = GaugeMetricFamily(
            "onepass_context_waiting",
            "steps of work waiting for one of the model's contexts, by lane",
            labels=["model", "lane"],
        )
        waited = CounterMetricFamily(
            "onepass_context_wait_seconds", "time steps of work waited for a context, by lane", labels=["model", "lane"]
        )
        # rows over decodes is the rows a step decodes, on average (prefill pieces and question decodes)
        decodes = CounterMetricFamily(
            "onepass_decodes", "llama_decodes of text rows run to their end", labels=["model"]
        )
        rows = CounterMetricFamily("onepass_decoded_rows", "the rows of those decodes", labels=["model"])
        # batch_requests: requests over decodes is how many shared a decode, on average
        shared = {
            "decodes": CounterMetricFamily(
                "onepass_shared_decodes", "question decodes of waiting requests, led together", labels=["model"]
            ),
            "requests": CounterMetricFamily(
                "onepass_shared_decode_requests", "requests answered in those decodes", labels=["model"]
            ),
        }
        for model, stats in found.get("models", {}).items():
            for counter_of, count in zip(shared.values(), stats["shared_decodes"], strict=True):
                counter_of.add_metric([model], count)
            for name, family in requests.items():
                family.add_metric([model], stats[name])
            for tier, tier_stats in stats["tiers"].items():
                if not tier_stats["enabled"]:
                    continue
                for name, gauge in gauges.items():
                    if name in tier_stats:
                        gauge.add_metric([model, tier], tier_stats[name])
                for name, counter in counters.items():
                    if name in tier_stats:
                        counter.add_metric([model, tier], tier_stats[name])
            for reason, count in stats["tiers"]["disk"].get("rejected", {}).items():
                rejected.add_metric([model, reason], count)
            prefilled.add_metric([model], stats["prefilled_tokens"])
            for lane, seconds in stats["busy_seconds"].items():
                busy.add_metric([model, lane], seconds)
            for lane, (count, seconds) in stats["waits"].items():
                waiting.add_metric([model, lane], count)
                waited.add_metric([model, lane], seconds)
            decodes.add_metric([model], stats["decoded"][0])
            rows.add_metric([model], stats["decoded"][1])
        yield from requests.values()
        yield from gauges.values()
        yield from counters.values()
        yield rejected
        yield prefilled
        yield busy
        yield from (waiting, waited, decodes, rows)
        yield from shared.values()


class RequestObserver:
    """`headers` go on every response (the replica's name, for a fleet behind a proxy)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, headers: Mapping[str, str] | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.headers = [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        # echoed byte for byte (a header is bytes; decoding and encoding it again would change a non-ASCII id)
        request_id = headers.get(REQUEST_ID.encode(), b"")[:128] or uuid.uuid4().hex.encode()
        observed: dict[str, Any] = {}
        scope.setdefault("state", {})["observed"] = observed
        status = 500
        began = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (REQUEST_ID.encode(), request_id),
                    *self.headers,
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            seconds = time.perf_counter() - began
            route = _route(scope)
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route, observed.get("cache", "none")).observe(seconds)
            # A load balancer probes every second; a healthy answer to it is not news.
            probe = route in PROBE_ROUTES and status == 200
            log.log(
                logging.DEBUG if probe else logging.INFO,
                "%s",
                json.dumps(
                    {
                        "request_id": request_id.decode("utf-8", "backslashreplace"),
                        "method": scope["method"],
                        "route": route,
                        "status": status,
                        "ms": round(seconds * 1000, 1),
                        **observed,
                    }
                ),
            )


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path: str = getattr(route, "path", None) or scope["path"]
    return path if route is not None else "unmatched"
