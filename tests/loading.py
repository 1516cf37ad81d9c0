"""Loading a model for a test from Settings alone, without a config file."""

from __future__ import annotations

from app.config import Settings
from app.loading import load_spec
from app.model_config import ModelSpec
from app.service import ModelService


def load_model(settings: Settings) -> ModelService:
    return load_spec(ModelSpec.from_settings(settings))
