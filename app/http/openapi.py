"""GET /openapi.json: the contract as OpenAPI 3.1, generated from the pydantic models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.contract import ErrorResponse, SystemOneRequest, SystemOneResponse, ValidationErrorResponse

REF = "#/components/schemas/{model}"


def _json(ref: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": ref}}}}


def build_openapi(version: str) -> dict[str, Any]:
    models: list[type[BaseModel]] = [SystemOneRequest, SystemOneResponse, ValidationErrorResponse, ErrorResponse]
    refs, schema = models_json_schema(
        [(m, "validation" if m is SystemOneRequest else "serialization") for m in models], ref_template=REF
    )
    ref = {m: refs[(m, "validation" if m is SystemOneRequest else "serialization")]["$ref"] for m in models}
    error = _json(ref[ErrorResponse])
    errors = {
        "401": {"description": "missing or wrong API key", **error},
        "413": {"description": "body too large", **error},
        "415": {"description": "unsupported Content-Encoding", **error},
        "422": {"description": "invalid request", **_json(ref[ValidationErrorResponse])},
        "404": {"description": "unknown model", **error},
        "503": {"description": "overloaded, loading, or the model is unavailable", **error},
        "504": {"description": "the request timed out", **error},
    }
    json_object = {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "onepass (System One API)", "version": version},
        "paths": {
            "/v1/systemone": {
                "post": {
                    "operationId": "systemOne",
                    "requestBody": {"required": True, **_json(ref[SystemOneRequest])},
                    "responses": {
                        "200": {"description": "one answer per question", **_json(ref[SystemOneResponse])},
                        **errors,
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "responses": {"200": json_object, "401": errors["401"], "503": errors["503"]},
                }
            },
            "/health/live": {"get": {"operationId": "live", "responses": {"200": json_object}}},
            **_calibration_paths(error, errors, json_object),
        },
        "components": {"schemas": schema.get("$defs", {})},
    }


def _calibration_paths(error: dict[str, Any], errors: dict[str, Any], json_object: dict[str, Any]) -> dict[str, Any]:
    """Fitting calibration to your examples (docs/calibration.md): a job, its progress, the fits."""
    example = {
        "type": "object",
        "required": ["state", "questions"],
        "properties": {
            "state": {},
            "questions": {"type": "object"},
            "answers": {"type": "object", "description": "per question: true/false, an option name, a level index"},
        },
    }
    body = {
        "type": "object",
        "required": ["examples"],
        "properties": {
            "model": {"type": "string"},
            "examples": {"type": "array", "items": example},
            "question_set": {"type": "boolean", "description": "also try the opt-in question-set fit"},
        },
    }
    job = {"description": "the job: done, total, ETA, and the report once finished", **json_object["content"]}
    return {
        "/v1/calibrations": {
            "post": {
                "operationId": "startCalibration",
                "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                "responses": {"202": job, "401": errors["401"], "404": errors["404"], "422": errors["422"]},
            },
            "get": {"operationId": "listCalibrations", "responses": {"200": json_object, "401": errors["401"]}},
        },
        "/v1/calibrations/jobs/{id}": {
            "get": {
                "operationId": "calibrationJob",
                "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": job, "404": {"description": "no such job", **error}},
            }
        },
        "/v1/calibrations/{id}": {
            "delete": {
                "operationId": "deleteCalibration",
                "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": json_object, "404": {"description": "no such fit", **error}},
            }
        },
    }
