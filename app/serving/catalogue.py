"""What GET /v1/models lists: every name a client may ask for, in the two shapes clients expect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CatalogueEntry:
    """One name /v1/models lists: a model's own name or an alias, and the model it means."""

    name: str
    model: str
    file_name: str  # the GGUF's file name
    settings: dict[str, Any]  # the model's per-model settings as JSON values: each is reported as x_<name>
    loaded: bool
    error: str | None
    decision_type: str | None = None  # a decision GGUF's type (answering/decision_format.py); None: onepass's prompt
    takes_images: bool = False  # a vision projector (mmproj) is loaded with the model


# A setting shown on /v1/models under another name than x_<setting>: an answer's x_calibration is the fit it used.
SETTING_FIELDS = {"calibration": "calibration_mode"}


def models_listing(entries: list[CatalogueEntry]) -> dict[str, Any]:
    """GET /v1/models in both shapes clients expect: OpenAI's `data` and System One's `models`."""
    return {
        "object": "list",
        "data": [
            {
                "id": e.name,
                "object": "model",
                "owned_by": "onepass",
                "x_model": e.model,
                "x_loaded": e.loaded,
                "x_decision_type": e.decision_type,
                "x_takes_images": e.takes_images,
            }
            for e in entries
        ],
        "models": [
            {
                "name": e.name,
                "description": f"{e.file_name} served by onepass"
                + ("" if e.name == e.model else f" (alias of {e.model})"),
                "release_date": "unknown",
                "x_model": e.model,
                "x_loaded": e.loaded,
                "x_error": e.error,
                "x_decision_type": e.decision_type,
                "x_takes_images": e.takes_images,
                **{f"x_{SETTING_FIELDS.get(key, key)}": value for key, value in e.settings.items()},
            }
            for e in entries
        ],
    }
