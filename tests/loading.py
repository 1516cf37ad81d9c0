"""Loading a model for a test from Settings alone, without a config file."""

from __future__ import annotations

from app.config import Settings
from app.loading import load_spec
from app.model_config import ModelSpec
from app.prompting import Prompter
from app.service import ModelService


def load_model(settings: Settings) -> ModelService:
    return load_spec(ModelSpec.from_settings(settings))


def own_prompter(service: ModelService) -> Prompter:
    """The service's prompter, which a test of onepass's own prompt expects (not a decision model's)."""
    assert isinstance(service.prompter, Prompter)
    return service.prompter
