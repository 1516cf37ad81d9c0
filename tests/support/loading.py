"""Loading a model for a test from Settings alone, without a config file."""

from __future__ import annotations

from app.answering.prompting import OwnPrompter
from app.answering.service import ModelService
from app.config import Settings
from app.serving.loading import load_spec
from app.serving.specs import ModelSpec


def load_model(settings: Settings) -> ModelService:
    return load_spec(ModelSpec.from_settings(settings))


def own_prompter(service: ModelService) -> OwnPrompter:
    """The service's prompter, which a test of onepass's own prompt expects (not a decision model's)."""
    assert isinstance(service.prompter, OwnPrompter)
    return service.prompter
