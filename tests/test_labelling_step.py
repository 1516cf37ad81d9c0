"""The labelling loop's step (app/labelling/step.py) is one: bench/labelling.py draws the states the
product draws, and its ranked loop runs the product's step of answering, picking and refitting."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path

from app.answering.service import ModelService
from app.jobs import JobRegistry
from app.labelling.labels import LabelsFile, labels_path
from app.labelling.session import LabellingSession, read_states
from app.labelling.step import content, drawn_states
from bench import labelling as bench
from tests.support.labelling_states import QUESTIONS, state


def no_model() -> AbstractContextManager[ModelService]:
    raise AssertionError("which states are drawn needs no model")


def test_the_bench_draws_the_states_a_labelling_session_draws(tmp_path: Path) -> None:
    workload = {"questions": QUESTIONS, "items": [{"state": state(i)["state"]} for i in range(40)]}
    path = tmp_path / "states.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in bench.states_of(workload)))
    session = LabellingSession(read_states(path), LabelsFile(labels_path(path)), "m", no_model, JobRegistry("t"))
    assert drawn_states([content(item) for item in bench.states_of(workload)]) == session.drawn
    assert len(session.drawn) == 10
