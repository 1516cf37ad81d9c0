"""The API's route table: every path, its methods and its handler (the page is mounted after these)."""

from __future__ import annotations

from starlette.routing import BaseRoute, Route

from app.http.calibrations import delete_fit, fitting_job, list_fits, start_fitting
from app.http.labelling import labelling, next_states, store_label
from app.http.models import cache_stats, list_models, load_model_route, unload_model_route
from app.http.operations import health, health_live, metrics_text, openapi_json, reload_config
from app.http.systemone import batch_job, cancel_batch_job, systemone

API_ROUTES: list[BaseRoute] = [
    Route("/v1/systemone", systemone, methods=["POST"]),
    Route("/v1/systemone/jobs/{id}", batch_job, methods=["GET"]),
    Route("/v1/systemone/jobs/{id}", cancel_batch_job, methods=["DELETE"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{name:path}/load", load_model_route, methods=["POST"]),
    Route("/v1/models/{name:path}/unload", unload_model_route, methods=["POST"]),
    Route("/v1/config/reload", reload_config, methods=["POST"]),
    Route("/v1/cache", cache_stats, methods=["GET"]),
    Route("/v1/calibrations", start_fitting, methods=["POST"]),
    Route("/v1/calibrations", list_fits, methods=["GET"]),
    Route("/v1/calibrations/jobs/{id}", fitting_job, methods=["GET"]),
    Route("/v1/calibrations/{id}", delete_fit, methods=["DELETE"]),
    Route("/v1/labelling", labelling, methods=["GET"]),
    Route("/v1/labelling/next", next_states, methods=["GET"]),
    Route("/v1/labelling/labels", store_label, methods=["POST"]),
    Route("/metrics", metrics_text, methods=["GET"]),
    Route("/openapi.json", openapi_json, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/health/live", health_live, methods=["GET"]),
]
