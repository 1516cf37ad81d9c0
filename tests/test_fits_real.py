"""Fitted calibration on the real default model: a log-triage pipeline (bench/pipelines.py) whose
policies the model applies badly zero-shot; a few dozen labelled examples make it right on new states."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.fitting.examples import parse_examples
from app.fitting.runner import answer_all, fit_all
from app.progress import Progress
from app.wire.contract import SystemOneRequest
from bench.pipelines import WORKLOADS
from tests.support.loading import load_model
from tests.support.settings import isolated_settings

pytestmark = pytest.mark.real_model


def test_fits_from_36_examples_answer_new_log_lines_far_better_than_zero_shot(
    real_model_path: Path, tmp_path: Path
) -> None:
    logs = next(w for w in WORKLOADS if w.name == "logs")
    train, new = logs.examples(36, seed=0), logs.examples(12, seed=1)

    def served(folder: Path):  # type: ignore[no-untyped-def]
        return load_model(
            isolated_settings(
                model=real_model_path,
                n_ctx=4096,
                session_cache_disk_bytes=0,
                calibration="contextual",
                calibration_temperature=0.45,
                calibration_dir=folder,
            )
        )

    fitted, plain = served(tmp_path / "fits"), served(tmp_path / "none")
    try:
        parsed = parse_examples(train)
        evidence = answer_all(fitted, parsed, Progress(len(parsed), "examples", show=False)).evidence
        reports, records = fit_all(parsed, evidence, fitted.calibration, question_set=False)
        assert any(r.to_json()["method"].startswith(("probe/", "state_probe/")) for r in reports)
        assert fitted.calibration.store is not None
        for record in records:
            fitted.calibration.store.put(record)
        right: dict[str, list[float]] = {"fitted": [], "today": []}
        for example in new:
            request = SystemOneRequest.model_validate(
                {"model": "jev-latest", "state": example["state"], "questions": example["questions"]}
            )
            for which, service in (("fitted", fitted), ("today", plain)):
                answers = service.answer(request).wire()["answers"]
                right[which] += [float(picked(answers[q]) == example["answers"][q]) for q in example["answers"]]
    finally:
        fitted.close()
        plain.close()
    assert np.mean(right["fitted"]) > np.mean(right["today"]) + 0.2


def picked(answer: dict[str, object]) -> object:
    """The answer's top label as the examples spell it: true/false, the option, the level index."""
    if "noul" in answer:
        return answer["noul"] >= 0.5  # type: ignore[operator]
    if "choice" in answer:
        return answer["choice"]
    levels = answer["probabilities"]
    assert isinstance(levels, dict)
    return int(max(levels, key=levels.__getitem__))  # keyed by level index
