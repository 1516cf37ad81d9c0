"""Labelled examples with a bias any fit can learn, and the tiny model served to fit them, for the tests
of fits served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.answering.service import ModelService
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

TEAM = {"type": "choice", "instructions": "Which team?", "criteria": {"Alpha": None, "Beta": None, "Gamma": None}}

URGENT = {"type": "noul", "instructions": "Is it urgent?"}


def examples(n: int) -> list[dict[str, Any]]:
    """The right team is Alpha eight times in ten (Beta and Gamma once each) and one ticket in ten is
    urgent, whatever the state says: a bias any fit can learn, with every label seen."""
    return [
        {
            "state": f"Ticket {i}: " + " ".join(f"word{(i * 13 + j) % 89}" for j in range(20)),
            "questions": {"team": TEAM, "urgent": URGENT},
            "answers": {"team": {3: "Beta", 7: "Gamma"}.get(i % 10, "Alpha"), "urgent": i % 10 == 5},
        }
        for i in range(n)
    ]


def served(path: Path, folder: Path, **overrides: Any) -> ModelService:
    return load_model(tiny_settings(path, calibration="contextual", calibration_dir=folder, **overrides))
