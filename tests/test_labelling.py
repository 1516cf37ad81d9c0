"""Labelling (`onepass label`, /v1/labelling) on the tiny model with real llama.cpp: the labels file
(verified lines, atomic rewrites, a damaged line skipped, read by `onepass calibrate`), the session over
HTTP (ranking, 422s that store nothing, refits that change the served answers, labels during a refit)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.answering.service import ModelService
from app.calibration import Calibration
from app.fitting.cli import main as calibrate_main
from app.fitting.examples import ExampleError, parse_examples, read_examples
from app.fitting.journal import EvidenceJournal
from app.http.server import create_app
from app.labelling.labels import LabelsFile, digest_of, labels_path
from app.labelling.session import NOT_ADOPTED, LabellingFiles, LabellingSession, read_states
from app.serving.registry import ModelRegistry
from tests.support.labelling_states import (
    QUESTIONS,
    TEAM,
    URGENT,
    WAIT_S,
    answered,
    index_of,
    line_of,
    right,
    settled,
    state,
    write_states,
)
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

# --- the labels file ------------------------------------------------------------------------------


def test_each_label_is_a_verified_line_in_calibrate_s_format_and_a_relabel_replaces_it(tmp_path: Path) -> None:
    path = labels_path(tmp_path / "states.jsonl")
    assert path.name == "states.labels.jsonl"
    labels = LabelsFile(path)
    labels.put(4, {**state(1), "answers": right(1)})
    labels.put(2, {**state(0), "answers": {"team": "Beta"}})
    labels.put(4, {**state(1), "answers": {"team": "Gamma", "urgent": True}})  # again: replaces line 4's
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["x_state"] for line in lines] == [2, 4]
    assert lines[1]["answers"] == {"team": "Gamma", "urgent": True}
    assert all(line["x_digest"] == digest_of(line) for line in lines)
    assert sorted(os.listdir(tmp_path)) == ["states.labels.jsonl"]  # no temporary file left behind
    parsed = read_examples(path.read_text())  # what onepass calibrate reads
    assert [e.answers for e in parsed] == [{"team": 1}, {"team": 2, "urgent": 0}]
    assert LabelsFile(path).lines() == {2: lines[0], 4: lines[1]} and not LabelsFile(path).warnings


def test_a_label_keeps_the_order_of_the_questions_and_options_so_calibrate_asks_the_same_prompt(
    tmp_path: Path,
) -> None:
    team = {**TEAM, "criteria": {"Gamma": None, "Alpha": None, "Beta": None}}
    example = {"state": "Ticket 1: the printer is on fire", "questions": {"urgent": URGENT, "team": team}}
    labels = LabelsFile(tmp_path / "s.labels.jsonl")
    labels.put(1, {**example, "answers": {"urgent": True, "team": "Beta"}})
    (line,) = labels.path.read_text().splitlines()
    questions = json.loads(line)["questions"]
    assert list(questions) == ["urgent", "team"] and list(questions["team"]["criteria"]) == ["Gamma", "Alpha", "Beta"]
    journal = EvidenceJournal(tmp_path, "model")  # the evidence the session answered is found again
    (read,) = read_examples(line)
    (given,) = parse_examples([{**example, "answers": {"urgent": True}}])
    assert journal.key(read.request, hidden=True) == journal.key(given.request, hidden=True)


def test_a_failed_rewrite_leaves_the_file_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "labels.jsonl"
    labels = LabelsFile(path)
    labels.put(1, {**state(0), "answers": right(0)})
    before = path.read_bytes()

    def full_disk(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        labels.put(2, {**state(1), "answers": right(1)})
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["labels.jsonl"]
    assert set(labels.lines()) == {1}  # what it holds is what the file holds
    labels.put(3, {**state(2), "answers": right(2)})
    assert [json.loads(line)["x_state"] for line in path.read_text().splitlines()] == [1, 3]


def test_a_damaged_line_is_skipped_with_a_warning_naming_it_and_the_file_kept(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    labels = LabelsFile(path)
    for n in (1, 2, 3):
        labels.put(n, {**state(n), "answers": right(n)})
    lines = path.read_text().splitlines()
    edited = json.loads(lines[1])
    edited["answers"]["team"] = "Gamma"  # by hand: the digest no longer matches
    damaged = "\n".join([lines[0], json.dumps(edited), lines[2][: len(lines[2]) // 2]]) + "\n"
    path.write_text(damaged)
    again = LabelsFile(path)
    assert set(again.lines()) == {1}
    assert any("line 2 skipped: its digest does not match" in w for w in again.warnings)
    assert any("line 3 skipped: not JSON" in w for w in again.warnings)
    assert (tmp_path / "labels.jsonl.damaged").read_text() == damaged
    again.put(5, {**state(5), "answers": right(5)})
    assert [json.loads(line)["x_state"] for line in path.read_text().splitlines()] == [1, 5]


def test_onepass_calibrate_reads_the_labels_file_as_it_is(
    tiny_chat_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    labels = LabelsFile(tmp_path / "s.labels.jsonl")
    for i in range(10):
        labels.put(line_of(i), {**state(i), "answers": right(i)})
    flags = ["-m", str(tiny_chat_path), "-t", "1", "--repack", "off", "--flash-attn", "off"]
    flags += ["--session-cache-disk-bytes", "0", "--calibration-dir", str(tmp_path / "fits")]
    calibrate_main([str(labels.path), *flags])
    shown = capsys.readouterr().out
    assert "team: 10 labelled" in shown and "urgent: 10 labelled" in shown
    assert (tmp_path / "s.labels.report.md").is_file()


def test_a_states_file_with_a_bad_line_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = write_states(tmp_path / "s.jsonl", 5)
    path.write_text(path.read_text() + json.dumps({**state(9), "answers": {"team": "Delta"}}) + "\n")
    with pytest.raises(ExampleError, match=r"s.jsonl: line 7: answers.team: 'Delta' is not one of the options"):
        read_states(path)
    path.write_text(json.dumps({"state": "no questions asked"}) + "\n")
    with pytest.raises(ExampleError, match=r"s.jsonl: line 1: an example needs questions$"):
        read_states(path)


# --- the session over HTTP ------------------------------------------------------------------------


def served(tiny_chat_path: Path, folder: Path) -> ModelService:
    return load_model(tiny_settings(tiny_chat_path, calibration="contextual", calibration_dir=folder / "fits"))


@pytest.fixture
def labelling(tiny_chat_path: Path, tmp_path: Path) -> Iterator[tuple[TestClient, LabellingSession, Path]]:
    """A server over the tiny model with a session for 24 states, 4 of them labelled in the states file."""
    states = write_states(tmp_path / "states.jsonl", 24, labelled=4)
    files = LabellingFiles(read_states(states), LabelsFile(labels_path(states)))
    service = served(tiny_chat_path, tmp_path)
    app = create_app(tiny_settings(tiny_chat_path), registry=ModelRegistry.serving(service), labelling=files)
    try:
        with TestClient(app) as client:
            session = client.app.state.runtime.labelling  # type: ignore[attr-defined]
            answered(session)
            yield client, session, labels_path(states)
    finally:
        service.close()


def post(client: TestClient, line: int, answers: Any) -> Any:
    return client.post("/v1/labelling/labels", json={"state": line, "answers": answers})


def test_without_a_session_the_routes_say_so_with_a_404(client: TestClient) -> None:
    for method, path in (("GET", "/v1/labelling"), ("GET", "/v1/labelling/next"), ("POST", "/v1/labelling/labels")):
        refused = client.request(method, path, json={"state": 1, "answers": {}})
        assert refused.status_code == 404
        assert (
            refused.json()["detail"]["error_type"] == "not_found"
            and "onepass label" in refused.json()["detail"]["message"]
        )


def test_the_ranking_offers_unlabelled_states_only_with_their_answers(
    labelling: tuple[TestClient, LabellingSession, Path],
) -> None:
    client, _, _ = labelling
    overview = client.get("/v1/labelling").json()
    assert overview["states"] == 24 and overview["labelled"] == 4
    assert overview["answering"]["status"] == "done" and overview["answering"]["done"] == 24
    team = next(q for q in overview["questions"] if q["name"] == "team")
    assert team["labelled"] == 4 and team["note"] == "no fit yet (4 of 8 labels)" and team["method"] is None
    offered = client.get("/v1/labelling/next?count=50").json()["states"]
    assert len(offered) == 20 and {index_of(s["state"]) for s in offered} == set(range(4, 24))
    first = offered[0]
    assert first["questions"] == QUESTIONS and first["text"] == state(index_of(first["state"]))["state"]
    assert set(first["answers"]) == {"team", "urgent"} and first["images"] == []
    assert "x_set" not in first["answers"]["team"]  # no fit yet: no set
    # each answer as /v1/systemone gives it for that state now, its share on the labels included
    asked = {"model": "jev-latest", "state": first["text"], "questions": first["questions"]}
    served = client.post("/v1/systemone", json=asked).json()["answers"]
    assert first["answers"] == served and all(0 < a["x_label_mass"] <= 1 for a in served.values())
    assert [s["state"] for s in client.get("/v1/labelling/next?count=3").json()["states"]] == [
        s["state"] for s in offered[:3]
    ]
    for count in ("0", "51", "two", "-1"):
        refused = client.get(f"/v1/labelling/next?count={count}")
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "count"]


def test_the_states_skipped_are_left_out_of_the_queue_however_many_and_the_rest_keep_their_order(
    labelling: tuple[TestClient, LabellingSession, Path],
) -> None:
    client, _, _ = labelling
    offered = [s["state"] for s in client.get("/v1/labelling/next?count=50").json()["states"]]
    assert len(offered) == 20

    def queue(count: int, skipped: list[int]) -> list[int]:
        reply = client.get(f"/v1/labelling/next?count={count}&skip={','.join(map(str, skipped))}")
        assert reply.status_code == 200, reply.text
        return [s["state"] for s in reply.json()["states"]]

    assert queue(10, offered[:-1]) == offered[-1:]  # every state but one skipped: that one is still offered
    assert queue(3, [offered[0], offered[2]]) == [offered[1], *offered[3:5]]
    assert queue(5, [*offered[:2], line_of(0)]) == offered[2:7]  # a labelled state skipped changes nothing
    for skip in ("abc", "999", "4", f"{offered[0]},", "\u00b2"):  # line 4 is the blank line
        refused = client.get("/v1/labelling/next", params={"count": "1", "skip": skip})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "skip"], skip


def test_a_bad_label_is_a_422_at_its_field_and_stores_nothing(
    labelling: tuple[TestClient, LabellingSession, Path],
) -> None:
    client, _, labels = labelling
    line = line_of(5)
    cases = [
        ({"state": line, "answers": {"team": "Delta"}}, ["body", "answers", "team"], "is not one of the options"),
        ({"state": line, "answers": {"urgent": "yes"}}, ["body", "answers", "urgent"], "true or false"),
        ({"state": line, "answers": {"nope": True}}, ["body", "answers", "nope"], "no question 'nope'"),
        ({"state": line, "answers": {}}, ["body", "answers"], "at least one question's answer"),
        ({"state": line, "answers": ["Alpha"]}, ["body", "answers"], "an object of answers"),
        ({"state": 4, "answers": right(5)}, ["body", "state"], "a state's line"),  # the blank line
        ({"state": 999, "answers": right(5)}, ["body", "state"], "a state's line"),
        ({"state": "5", "answers": right(5)}, ["body", "state"], "a state's line"),
        ([1, 2], ["body"], "an object"),
    ]
    for body, loc, message in cases:
        refused = client.post("/v1/labelling/labels", json=body)
        assert refused.status_code == 422, body
        assert refused.json()["detail"][0]["loc"] == loc and message in refused.json()["detail"][0]["msg"]
    not_json = client.post("/v1/labelling/labels", content=b"{", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 422
    assert not labels.exists()
    assert client.get("/v1/labelling").json()["labelled"] == 4


def test_after_eight_labels_a_refit_changes_the_served_answers_and_the_session_s(
    labelling: tuple[TestClient, LabellingSession, Path],
) -> None:
    client, session, labels = labelling
    ask = {"model": "jev-latest", "state": "A new ticket nobody labelled.", "questions": {"q": TEAM}}
    before = client.post("/v1/systemone", json=ask).json()["answers"]["q"]
    assert "x_calibration" not in before
    offered = client.get("/v1/labelling/next?count=6").json()["states"]
    for item in offered:
        stored = post(client, item["state"], right(index_of(item["state"])))
        assert stored.status_code == 200 and stored.json()["stored"]["x_state"] == item["state"]
        assert stored.json()["stored"]["x_drawn"] is (item["state"] in session.drawn_lines)
    settled(session)
    overview = client.get("/v1/labelling").json()
    assert overview["labelled"] == 10 and overview["refit"]["status"].startswith("done")
    job = client.get(f"/v1/calibrations/jobs/{overview['refit']['id']}").json()  # a calibration job like any
    assert job["total"] == 10 and job["reused"] == 10 and {r["labelled"] for r in job["report"]} == {10}
    team = next(q for q in overview["questions"] if q["name"] == "team")
    assert team["labelled"] == 10 and team["method"] and team["note"] is None
    assert 0 <= team["accuracy"] <= 1 and set(team["sets"]) == {"coverage", "size"}
    assert 0 <= team["mean_set_size"] <= len(TEAM["criteria"])  # a set may be empty, or hold every label
    after = client.post("/v1/systemone", json=ask).json()["answers"]["q"]
    assert after["x_calibration"]["method"] == team["method"] and after["x_calibration"]["examples"] == 10
    assert after["probabilities"] != before["probabilities"] and "x_set" in after
    now = client.get("/v1/labelling/next?count=1").json()["states"][0]
    assert now["answers"]["team"]["x_calibration"]["id"] == after["x_calibration"]["id"]
    assert now["answers"]["team"]["x_set"]["coverage"] == 0.9
    assert len(labels.read_text().splitlines()) == 6


@pytest.mark.parametrize("run", range(5))
def test_labels_that_arrive_during_a_refit_are_all_refitted_on(
    labelling: tuple[TestClient, LabellingSession, Path], run: int
) -> None:
    """Twelve labels from four threads at once: each is stored, refits do not pile up (one runs, and at
    most one more is owed), and the last refit read every label."""
    client, session, labels = labelling
    offered = [s["state"] for s in client.get("/v1/labelling/next?count=12").json()["states"]]
    started: list[str] = []
    lock = threading.Lock()

    def label(lines: list[int]) -> None:
        for line in lines:
            reply = post(client, line, right(index_of(line)))
            assert reply.status_code == 200
            with lock:
                started.append(reply.json()["stored"]["x_state"])
                running = [job for job in session.jobs.all() if job.running and job is not session.answering]
                assert len(running) <= 2  # one refit, and the one it started as it ended: never a queue

    threads = [threading.Thread(target=label, args=(offered[k::4],)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    settled(session)
    assert sorted(started) == sorted(offered) and len(labels.read_text().splitlines()) == 12
    assert session.refit is not None and session.refit.work.progress.total == 16  # the 4 in the states file too
    assert session.refit.status.startswith("done") and not session.refit_pending


class HeldCalibration(Calibration):
    """The model's calibration, whose first fit waits until the test lets it go: a refit caught running."""

    def __init__(self, inner: Calibration) -> None:
        self.__dict__.update(inner.__dict__)
        self.reached, self.release = threading.Event(), threading.Event()

    def choose(self, examples: Any, unlabelled: Any, key: str, ordered: bool, drawn: Any = None) -> Any:
        self.reached.set()
        assert self.release.wait(WAIT_S), "the test never let the refit go on"
        return super().choose(examples, unlabelled, key, ordered, drawn)


def test_labels_stored_while_a_refit_runs_get_one_more_refit_not_one_each(tiny_chat_path: Path, tmp_path: Path) -> None:
    states = write_states(tmp_path / "states.jsonl", 24, labelled=8)
    files = LabellingFiles(read_states(states), LabelsFile(labels_path(states)))
    service = served(tiny_chat_path, tmp_path)
    held = HeldCalibration(service.calibration)
    service.calibration = held
    app = create_app(tiny_settings(tiny_chat_path), registry=ModelRegistry.serving(service), labelling=files)
    try:
        with TestClient(app) as client:
            session: LabellingSession = client.app.state.runtime.labelling  # type: ignore[attr-defined]
            answered(session)  # eight labelled in the states file: a refit starts
            assert held.reached.wait(WAIT_S)
            first = session.refit
            assert first is not None and first.running
            for i in (10, 11, 12):  # stored while it runs, each owed the refit after it
                assert post(client, line_of(i), right(i)).json()["refit"] == "after the one running"
            overview = client.get("/v1/labelling").json()
            assert overview["refit"]["id"] == first.id and overview["refit_pending"] and overview["labelled"] == 11
            held.release.set()
            settled(session)
            refits = [job for job in session.jobs.all() if job is not session.answering]
            assert session.refit is not None  # one more refit, for all three labels
            assert [job.id for job in refits] == [first.id, session.refit.id]
            assert [job.work.progress.total for job in refits] == [8, 11]
            assert all(job.status.startswith("done") for job in refits) and not session.refit_pending
    finally:
        held.release.set()
        service.close()


class HeldAnswers(Calibration):
    """The model's calibration at another coverage, whose answers wait until the test lets them go: a
    slow run of answering the states again, caught running."""

    def __init__(self, inner: Calibration, coverage: float) -> None:
        self.__dict__.update(inner.__dict__)
        self.coverage = coverage
        self.reached, self.release = threading.Event(), threading.Event()

    def answer_evidence(self, *args: Any, **kwargs: Any) -> Any:
        self.reached.set()
        assert self.release.wait(WAIT_S), "the test never let the run go on"
        return super().answer_evidence(*args, **kwargs)


def test_answers_from_a_run_that_began_earlier_never_replace_a_later_run_s(
    labelling: tuple[TestClient, LabellingSession, Path],
) -> None:
    _, session, _ = labelling
    settled(session)
    with session.lease() as service:
        inner = service.calibration
    earlier, later = HeldAnswers(inner, 0.5), HeldAnswers(inner, 0.8)
    later.release.set()
    try:
        service.calibration = earlier
        slow = threading.Thread(target=session.refitted)
        slow.start()
        assert earlier.reached.wait(WAIT_S)
        service.calibration = later  # the fits as a refit that ended meanwhile left them
        session.refitted()
        assert session.coverage == 0.8
        earlier.release.set()
        slow.join(WAIT_S)
        assert not slow.is_alive() and session.coverage == 0.8
    finally:
        earlier.release.set()
        service.calibration = inner


class Declining(Calibration):
    """The model's calibration, whose choices keep contextual calibration: a refit that adopts no fit."""

    def __init__(self, inner: Calibration) -> None:
        self.__dict__.update(inner.__dict__)

    def choose(self, examples: Any, unlabelled: Any, key: str, ordered: bool, drawn: Any = None) -> Any:
        choice = super().choose(examples, unlabelled, key, ordered, drawn)
        return replace(choice, fit=None, method="contextual", adopted=False, after=choice.before, sets=None)


def test_a_refit_that_adopts_no_fit_drops_the_session_s_earlier_fit(tiny_chat_path: Path, tmp_path: Path) -> None:
    states = write_states(tmp_path / "states.jsonl", 24, labelled=4)
    files = LabellingFiles(read_states(states), LabelsFile(labels_path(states)))
    service = served(tiny_chat_path, tmp_path)
    app = create_app(tiny_settings(tiny_chat_path), registry=ModelRegistry.serving(service), labelling=files)
    ask = {"model": "jev-latest", "state": "A new ticket nobody labelled.", "questions": {"q": TEAM}}
    try:
        with TestClient(app) as client:
            session: LabellingSession = client.app.state.runtime.labelling  # type: ignore[attr-defined]
            answered(session)
            for line in [s["state"] for s in client.get("/v1/labelling/next?count=6").json()["states"]]:
                assert post(client, line, right(index_of(line))).status_code == 200
            settled(session)
            fitted = client.post("/v1/systemone", json=ask).json()["answers"]["q"]
            assert fitted["x_calibration"]["examples"] == 10  # the ten labels' fit answers
            service.calibration = Declining(service.calibration)  # the next refit finds no fit worth adopting
            line = client.get("/v1/labelling/next?count=1").json()["states"][0]["state"]
            assert post(client, line, right(index_of(line))).status_code == 200
            settled(session)
            assert session.refit is not None and session.refit.work.progress.total == 11
            after = client.post("/v1/systemone", json=ask).json()["answers"]["q"]
            assert "x_calibration" not in after and "x_set" not in after  # as before any label, not the old fit
            team = next(q for q in client.get("/v1/labelling").json()["questions"] if q["name"] == "team")
            assert team["method"] is None and team["note"] == NOT_ADOPTED
    finally:
        service.close()
