"""A fault planted in fitting one question, for the tests of fitting runs and jobs."""

from __future__ import annotations

from typing import Any

import pytest

from app.calibration import Calibration


def fail_fitting(monkeypatch: pytest.MonkeyPatch, broken: str) -> None:
    """Fitting the question whose content key is `broken` raises; every other question fits as ever."""
    choose = Calibration.choose

    def failing(self: Calibration, examples: Any, unlabelled: Any, key: str, ordered: bool, drawn: Any = None) -> Any:
        if key == broken:
            raise FloatingPointError("a fault injected into this question's fit")
        return choose(self, examples, unlabelled, key, ordered, drawn)

    monkeypatch.setattr(Calibration, "choose", failing)
