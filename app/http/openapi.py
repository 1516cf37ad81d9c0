"""GET /openapi.json: the contract as OpenAPI 3.1, generated from the pydantic models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app.http.multipart import MAX_PARTS, REQUEST_PART
from app.wire.contract import BatchRequest, ErrorResponse, SystemOneRequest, SystemOneResponse, ValidationErrorResponse
from app.wire.contract_jobs import BatchJob, BatchResponse, CalibrationJob

REF = "#/components/schemas/{model}"


def _json(ref: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": ref}}}}


def build_openapi(version: str) -> dict[str, Any]:
    models: list[type[BaseModel]] = [
        SystemOneRequest,
        SystemOneResponse,
        ValidationErrorResponse,
        ErrorResponse,
        BatchRequest,
        BatchResponse,
        BatchJob,
        CalibrationJob,
    ]
    inputs = (SystemOneRequest, BatchRequest)
    refs, schema = models_json_schema(
        [(m, "validation" if m in inputs else "serialization") for m in models], ref_template=REF
    )
    ref = {m: refs[(m, "validation" if m in inputs else "serialization")]["$ref"] for m in models}
    # a batch's items are validated one by one (each fails alone), but each is a request
    schema["$defs"]["BatchRequest"]["properties"]["requests"]["items"] = {"$ref": ref[SystemOneRequest]}
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
                    "requestBody": {"required": True, **_with_images(ref[SystemOneRequest], ref[BatchRequest])},
                    "responses": {
                        "200": {
                            "description": "one answer per question; for a batch, one result per request",
                            **_any_of(ref[SystemOneResponse], ref[BatchResponse]),
                        },
                        "202": {"description": "a large batch: the job answering it", **_json(ref[BatchJob])},
                        **errors,
                    },
                }
            },
            **_batch_job_paths(_json(ref[BatchJob]), error),
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "responses": {"200": json_object, "401": errors["401"], "503": errors["503"]},
                }
            },
            "/health/live": {"get": {"operationId": "live", "responses": {"200": json_object}}},
            **_calibration_paths(_json(ref[CalibrationJob]), error, errors, json_object),
            **_labelling_paths(error, errors, json_object),
        },
        "components": {"schemas": schema.get("$defs", {})},
    }


def _either(*refs: str) -> dict[str, Any]:
    return {"anyOf": [{"$ref": ref} for ref in refs]}


def _any_of(*refs: str) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": _either(*refs)}}}


def _with_images(*refs: str) -> dict[str, Any]:
    """One of `refs` as JSON, or as typesafe-sdk sends images (docs/api.md, "Images"): multipart/form-data,
    the JSON in its `request` part, then one part per image, named by an asset's `part`."""
    form = {
        "type": "object",
        "required": [REQUEST_PART],
        "properties": {REQUEST_PART: _either(*refs)},
        "additionalProperties": {"type": "string", "format": "binary", "description": "an image's bytes"},
        "maxProperties": MAX_PARTS,
    }
    encoding = {REQUEST_PART: {"contentType": "application/json"}}
    return {
        "content": {
            "application/json": {"schema": _either(*refs)},
            "multipart/form-data": {"schema": form, "encoding": encoding},
        }
    }


def _batch_job_paths(job: dict[str, Any], error: dict[str, Any]) -> dict[str, Any]:
    """A large batch's job: its progress and results, and cancelling it."""
    parameters = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
    responses = {"200": {"description": "the job", **job}, "404": {"description": "no such job", **error}}
    return {
        "/v1/systemone/jobs/{id}": {
            "get": {"operationId": "batchJob", "parameters": parameters, "responses": responses},
            "delete": {"operationId": "cancelBatchJob", "parameters": parameters, "responses": responses},
        }
    }


def _calibration_paths(
    fitting_job: dict[str, Any], error: dict[str, Any], errors: dict[str, Any], json_object: dict[str, Any]
) -> dict[str, Any]:
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
    job = {"description": "the job: done, total, ETA, and the report once finished", **fitting_job}
    return {
        "/v1/calibrations": {
            "post": {
                "operationId": "startCalibration",
                "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                "responses": {
                    "202": job,
                    "401": errors["401"],
                    "404": errors["404"],
                    "422": errors["422"],
                    "503": errors["503"],
                },
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


def _labelling_paths(error: dict[str, Any], errors: dict[str, Any], json_object: dict[str, Any]) -> dict[str, Any]:
    """`onepass label`'s session (docs/api.md#labelling); 404 on a server without one."""
    none = {"description": "this server has no labelling session", **error}
    label = {
        "type": "object",
        "required": ["state", "answers"],
        "properties": {
            "state": {"type": "integer", "description": "the state's line in the states file, from 1"},
            "answers": {"type": "object", "description": "per question: true/false, an option name, a level index"},
        },
    }
    count = {"name": "count", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}}
    return {
        "/v1/labelling": {
            "get": {"operationId": "labelling", "responses": {"200": json_object, "401": errors["401"], "404": none}}
        },
        "/v1/labelling/next": {
            "get": {
                "operationId": "labellingNext",
                "parameters": [count],
                "responses": {
                    "200": json_object,
                    "401": errors["401"],
                    "404": none,
                    "422": errors["422"],
                    "503": errors["503"],
                },
            }
        },
        "/v1/labelling/labels": {
            "post": {
                "operationId": "storeLabel",
                "requestBody": {"required": True, "content": {"application/json": {"schema": label}}},
                "responses": {"200": json_object, "401": errors["401"], "404": none, "422": errors["422"]},
            }
        },
    }
