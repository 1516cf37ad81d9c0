"""Fits from a user's examples in a served model (tiny model, real llama.cpp): stored as verified files,
matched by question content, applied bit-identically hit or miss, reported in x_calibration; the
HTTP job and the `onepass calibrate` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from app.calibration import Fit, FitRecord, FitStore, example_of, question_key
from app.calibration.candidates import ProbeCandidate
from app.calibration.store import SUFFIX
from app.fitting.cli import main as calibrate_main
from app.fitting.examples import ExampleError, parse_examples
from app.fitting.layouts import LayoutRun, recommend
from app.fitting.runner import answer_all, fit_all, served_seconds
from app.http.server import create_app
from app.paths import REPO_ROOT
from app.progress import Progress
from app.serving.registry import ModelRegistry
from app.wire.contract import SystemOneRequest
from tests.support.fit_examples import TEAM, URGENT, examples, served
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

OTHER = {"type": "score", "instructions": "How long is it?", "criteria": ["short", "medium", "long"]}


def body(state: str, questions: dict[str, Any]) -> dict[str, Any]:
    return {"model": "jev-latest", "state": state, "questions": questions}


@pytest.fixture(scope="module")
def fitted(tiny_chat_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Any]]]:
    folder = tmp_path_factory.mktemp("fits")
    service = served(tiny_chat_path, folder)
    try:
        parsed = parse_examples(examples(60))
        evidence = [service.evidence(example.request) for example in parsed]
        reports, records = fit_all(parsed, evidence, service.calibration, question_set=False)
        assert service.calibration.store is not None
        for record in records:
            service.calibration.store.put(record)
    finally:
        service.close()
    yield folder, [r.to_json() for r in reports]


def test_examples_are_checked_and_a_bad_one_is_named() -> None:
    with pytest.raises(ExampleError, match=r"example 2: answers\.team: 'Delta' is not one of the options"):
        parse_examples([examples(1)[0], {**examples(1)[0], "answers": {"team": "Delta"}}])
    with pytest.raises(ExampleError, match=r"example 1: answers\.urgent: a noul's answer is true or false"):
        parse_examples([{**examples(1)[0], "answers": {"urgent": "no"}}])
    with pytest.raises(ExampleError, match="keyed by the example's question ids"):
        parse_examples([{**examples(1)[0], "answers": {"nope": True}}])
    assert [e.drawn for e in parse_examples([examples(1)[0], {**examples(1)[0], "x_drawn": False}])] == [True, False]
    with pytest.raises(ExampleError, match="x_drawn is true or false"):
        parse_examples([{**examples(1)[0], "x_drawn": "no"}])


def test_a_learnable_bias_is_adopted_and_reported(fitted: tuple[Path, list[Any]]) -> None:
    _, reports = fitted
    by_id = {report["ids"][0]: report for report in reports}
    team = by_id["team"]
    assert team["adopted"] and team["labelled"] == 60 and team["method"] != "contextual"
    assert team["after"]["accuracy"] >= 0.8 and team["after"]["log_loss"] < team["before"]["log_loss"]
    assert {"accuracy", "brier", "ece", "reliability", "n"} <= set(team["after"])


def test_a_fit_answers_its_question_by_content_and_says_so(
    fitted: tuple[Path, list[Any]], tiny_chat_path: Path
) -> None:
    folder, _ = fitted
    service = served(tiny_chat_path, folder)
    plain = served(tiny_chat_path, folder / "elsewhere")  # no fits there
    try:
        # another id, the options in another order, a new state: the same question
        renamed = {"queue": {**TEAM, "criteria": {"Gamma": None, "Alpha": None, "Beta": None}}, "other": OTHER}
        request = SystemOneRequest.model_validate(body("A brand new ticket about nothing in particular.", renamed))
        with_fit = service.answer(request).wire()["answers"]
        without = plain.answer(request).wire()["answers"]
        assert with_fit["queue"]["choice"] == "Alpha" and with_fit["queue"]["probabilities"]["Alpha"] > 0.6
        used = with_fit["queue"]["x_calibration"]
        assert used["examples"] == 60 and used["method"] != "contextual" and len(used["id"]) == 16
        if used["method"].startswith("state_probe/"):  # read from the state alone: the queue is not read out
            assert "x_raw" not in with_fit["queue"]
            # no fit for it: as without fits, in a batch without the queue's readout
            assert with_fit["other"]["x_raw"] == pytest.approx(without["other"]["x_raw"], abs=1e-5)
            assert with_fit["other"]["probabilities"] == pytest.approx(without["other"]["probabilities"], abs=1e-5)
        else:
            assert with_fit["queue"]["x_raw"] == without["queue"]["x_raw"]  # the model's own answer, unchanged
            assert with_fit["other"] == without["other"]  # no fit for it: exactly as without fits
        assert "x_calibration" not in without["queue"]
    finally:
        service.close()
        plain.close()


def test_a_fitted_answer_carries_its_set_at_the_coverage_asked_and_an_unfitted_one_none(
    fitted: tuple[Path, list[Any]], tiny_chat_path: Path
) -> None:
    folder, reports = fitted
    team = next(report for report in reports if report["ids"] == ["team"])
    assert set(team["sets"]) == {"0.8", "0.9", "0.95"}
    assert all(0 <= s["coverage"] <= 1 and 1 <= s["size"] <= 3 for s in team["sets"].values())
    service = served(tiny_chat_path, folder)
    try:
        sets = {}
        for coverage in (None, 0.5, 0.9, 0.99):
            asked = body("Which team takes this ticket about a login?", {"team": TEAM, "other": OTHER})
            request = SystemOneRequest.model_validate(asked | ({"x_coverage": coverage} if coverage else {}))
            answers = service.answer(request).wire()["answers"]
            assert "x_set" not in answers["other"]  # no fit, no held-out answers: no set
            shown = answers["team"]["x_set"]
            assert shown["coverage"] == (coverage or 0.9)
            assert shown["labels"][:1] in ([], [answers["team"]["choice"]])  # most probable first
            sets[coverage] = shown["labels"]
        assert sets[None] == sets[0.9]
        assert set(sets[0.5]) <= set(sets[0.9]) <= set(sets[0.99])
        assert sorted(sets[0.99]) == ["Alpha", "Beta", "Gamma"]  # rank ceil(61 x 0.99) of 60 answers: every label
        urgent = service.answer(SystemOneRequest.model_validate(body("A ticket.", {"u": URGENT}))).wire()["answers"]
        if "x_calibration" in urgent["u"]:
            assert urgent["u"]["x_set"]["labels"] in ([], [True], [False], [True, False], [False, True])
        for wrong in (0, 1, 1.5, "high", "0.9", True):  # a number, as the contract says: not a string or a bool
            with pytest.raises(ValueError, match="x_coverage"):
                SystemOneRequest.model_validate(body("A ticket.", {"u": URGENT}) | {"x_coverage": wrong})
    finally:
        service.close()


def test_the_same_request_and_fits_give_the_same_numbers_hit_miss_or_cache_off(
    fitted: tuple[Path, list[Any]], tiny_chat_path: Path
) -> None:
    folder, _ = fitted
    request = SystemOneRequest.model_validate(body("Hit or miss, the fitted numbers agree.", {"t": TEAM, "u": URGENT}))
    on = served(tiny_chat_path, folder)
    off = served(tiny_chat_path, folder, session_cache_entries=0)
    try:
        miss, hit, uncached = on.answer(request), on.answer(request), off.answer(request)
        assert (miss.x_cache, hit.x_cache, uncached.x_cache) == ("miss", "hit", "off")
        numbers = {json.dumps(r.wire()["answers"], sort_keys=True) for r in (miss, hit, uncached)}
        assert len(numbers) == 1
    finally:
        on.close()
        off.close()


def test_a_damaged_or_foreign_fit_file_is_skipped(fitted: tuple[Path, list[Any]], tmp_path: Path) -> None:
    folder, _ = fitted
    (model_folder,) = [p for p in folder.iterdir() if p.is_dir()]
    files = sorted(model_folder.glob(f"*{SUFFIX}"))
    identity = json.loads(files[0].read_text())["identity"]
    copy = tmp_path / "copy"
    copy.mkdir()
    damaged = json.loads(files[0].read_text())
    damaged["examples"] = 9999  # its digest no longer matches
    (copy / files[0].name).write_text(json.dumps(damaged))
    foreign = FitStore(copy, "another-model-or-prompt")
    foreign.put(FitRecord.from_json(json.loads(files[-1].read_text())))
    store = FitStore(copy, identity)
    assert store.records() == []
    assert len(FitStore(model_folder, identity).records()) == len(files)


def test_fitting_over_http_is_a_job_with_progress_and_fits_can_be_listed_and_deleted(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    service = served(tiny_chat_path, tmp_path)
    settings = tiny_settings(tiny_chat_path, calibration_dir=tmp_path)
    with TestClient(create_app(settings, registry=ModelRegistry.serving(service))) as client:
        bad = client.post("/v1/calibrations", json={"examples": [{"state": "x", "questions": {}}]})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "examples"]
        started = client.post("/v1/calibrations", json={"model": "jev-latest", "examples": examples(40)})
        assert started.status_code == 202 and started.json()["total"] == 40
        job_id = started.json()["id"]
        assert started.headers["location"] == f"/v1/calibrations/jobs/{job_id}"
        job = client.app.state.runtime.fit_jobs.get(job_id)  # type: ignore[attr-defined]
        job.thread.join(120)
        done = client.get(f"/v1/calibrations/jobs/{job_id}").json()
        assert done["status"] == "done" and done["done"] == 40 and done["eta_s"] is None
        assert {fit["method"] for fit in done["fits"]} and {r["ids"][0] for r in done["report"]} == {"team", "urgent"}
        listed = client.get("/v1/calibrations").json()
        assert {fit["id"] for fit in listed["fits"]} == {fit["id"] for fit in done["fits"]}
        answered = client.post("/v1/systemone", json=body("After fitting.", {"team": TEAM})).json()
        fit_id = answered["answers"]["team"]["x_calibration"]["id"]
        assert client.delete(f"/v1/calibrations/{fit_id}").json() == {"model": "tiny-chat", "deleted": fit_id}
        assert client.delete(f"/v1/calibrations/{fit_id}").status_code == 404
        again = client.post("/v1/systemone", json=body("After deleting.", {"team": TEAM})).json()
        assert "x_calibration" not in again["answers"]["team"]
        assert client.get("/v1/calibrations/jobs/nope").status_code == 404
    service.close()


def test_onepass_calibrate_writes_fits_a_report_and_warns_on_few_examples(tiny_chat_path: Path, tmp_path: Path) -> None:
    data = tmp_path / "examples.jsonl"
    data.write_text("\n".join(json.dumps(e) for e in examples(20)) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPASS_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "calibrate",
            str(data),
            "-m",
            str(tiny_chat_path),
            "-t",
            "1",
            "--repack",
            "off",
            "--flash-attn",
            "off",
            "--session-cache-disk-bytes",
            "0",
            "--calibration-dir",
            str(tmp_path / "fits"),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "20/20" in done.stderr and "ETA" in done.stderr  # the progress line
    warned = [line for line in done.stderr.splitlines() if "only 20 labelled examples" in line]
    assert sorted(line.split("):")[0].strip() for line in warned) == ["warning (team", "warning (urgent"]  # named
    report = (tmp_path / "examples.report.md").read_text()
    assert report.startswith("# Calibration fitted to your examples: tiny-chat") and "reliability" in report
    assert "## Answer sets (x_set)" in report and "| 90% held / mean size |" in report
    assert (tmp_path / "examples.report.png").stat().st_size > 1000
    assert (
        "Reliability diagram: examples.report.png" in report
        and "Reliability diagram: examples.report.png" in done.stdout
    )
    stored = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1]["fits"]
    assert stored and all(fit["examples"] == 20 for fit in stored)
    assert len(list((tmp_path / "fits").rglob(f"*{SUFFIX}"))) == len(stored)


def test_onepass_calibrate_finds_the_model_by_any_name_the_server_takes(
    tiny_chat_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--serve-model takes what a request's `model` takes: a model's name, an alias, jev-latest."""
    for name in [name for name in os.environ if name.startswith("ONEPASS_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "onepass.toml"
    config.write_text(
        f'[server]\ndefault_model = "second"\n'
        f'[[models]]\nname = "first"\npath = "{tiny_chat_path}"\naliases = ["helper"]\n'
        f'[[models]]\nname = "second"\npath = "{tiny_chat_path}"\n'
    )
    data = tmp_path / "examples.jsonl"
    data.write_text("\n".join(json.dumps(e) for e in examples(4)) + "\n")
    flags = ["--config", str(config), "-t", "1", "--repack", "off", "--flash-attn", "off"]
    flags += ["--session-cache-disk-bytes", "0", "--calibration-dir", str(tmp_path / "fits")]
    for name, model in (("jev-latest", "second"), ("helper", "first"), ("first", "first")):
        report = tmp_path / f"{name}.md"
        calibrate_main([str(data), "--serve-model", name, "--report", str(report), *flags])
        assert report.read_text().startswith(f"# Calibration fitted to your examples: {model}\n")
    with pytest.raises(SystemExit) as refused:
        calibrate_main([str(data), "--serve-model", "nope", *flags])
    assert str(refused.value) == (
        "onepass calibrate: model 'nope' is not served here; known models: first, helper, second, jev-latest"
    )
    capsys.readouterr()


def test_a_question_set_fit_applies_only_when_the_request_asks_its_whole_set(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    team, urgent = (SystemOneRequest.model_validate(body("s", {"q": q})).questions["q"] for q in (TEAM, URGENT))
    keys = {"team": question_key(team), "urgent": question_key(urgent)}
    features = tuple(
        (keys[name], label)
        for name, labels in (("team", ("Alpha", "Beta", "Gamma")), ("urgent", ("false", "true")))
        for label in labels
    )
    weights = tuple(tuple(0.0 for _ in range(len(features) + 1)) for _ in range(3))
    fit = Fit(
        "question_set",
        ("Alpha", "Beta", "Gamma"),
        features=features,
        centre=(0.0,) * 5,
        spread=(1.0,) * 5,
        weights=((*weights[0][:-1], 2.0), *weights[1:]),
    )
    service = served(tiny_chat_path, tmp_path)
    try:
        assert service.calibration.store is not None
        service.calibration.store.put(
            FitRecord(
                keys["team"],
                team.model_dump(mode="json"),
                "question_set/0.1",
                fit,
                examples=7,
                question_set=tuple(sorted(keys.values())),
            )
        )
        app = create_app(tiny_settings(tiny_chat_path), registry=ModelRegistry.serving(service))
        with TestClient(app) as client:
            both = client.post("/v1/systemone", json=body("Both asked.", {"a": TEAM, "b": URGENT})).json()
            alone = client.post("/v1/systemone", json=body("Both asked.", {"a": TEAM})).json()
    finally:
        service.close()
    # the fit read the other question: the response says that its answers depend on it
    assert (both["x_depends_on"], alone["x_depends_on"]) == (["other_questions"], [])
    assert both["answers"]["a"]["x_calibration"]["method"] == "question_set/0.1"
    assert both["answers"]["a"]["probabilities"]["Alpha"] == pytest.approx(np.exp(2) / (np.exp(2) + 2))
    assert "x_calibration" not in both["answers"]["b"] and "x_calibration" not in alone["answers"]["a"]


def test_servers_sharing_a_folder_share_their_fits(
    fitted: tuple[Path, list[Any]], tiny_chat_path: Path, tmp_path: Path
) -> None:
    source, _ = fitted
    (model_folder,) = [p for p in source.iterdir() if p.is_dir()]
    one, two = served(tiny_chat_path, tmp_path), served(tiny_chat_path, tmp_path)
    try:
        request = SystemOneRequest.model_validate(body("Shared folder.", {"team": TEAM}))
        assert "x_calibration" not in two.answer(request).wire()["answers"]["team"]  # read: no fits yet
        assert (
            one.calibration.store is not None
            and two.calibration.store is not None
            and one.calibration.store.folder == two.calibration.store.folder
        )
        for record in FitStore(model_folder, one.calibration.store.identity).records():
            one.calibration.store.put(record)
        assert two.answer(request).wire()["answers"]["team"]["x_calibration"]["examples"] == 60
    finally:
        one.close()
        two.close()


def test_states_without_labels_get_batch_calibration_where_it_measured_better(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    unlabelled = [{k: v for k, v in e.items() if k != "answers"} for e in examples(24)]
    service = served(tiny_chat_path, tmp_path)
    try:
        parsed = parse_examples(unlabelled)
        evidence = [service.evidence(example.request) for example in parsed]
        reports, records = fit_all(parsed, evidence, service.calibration, question_set=False)
        by_id = {r.ids[0]: r.to_json() for r in reports}
        assert by_id["urgent"]["method"] == "batch (label-free)" and by_id["urgent"]["adopted"]
        assert by_id["team"]["method"] == "contextual" and "no labels" in by_id["team"]["warning"]
        (record,) = records
        mean_raw = np.mean([e["urgent"].raw for e in evidence], axis=0)
        assert record.fit.prior == pytest.approx(tuple(mean_raw[[1, 0]]))  # labels kept sorted
        assert service.calibration.store is not None
        service.calibration.store.put(record)
        answered = service.answer(SystemOneRequest.model_validate(body("New.", {"u": URGENT}))).wire()["answers"]
        assert answered["u"]["x_calibration"]["method"] == "batch (label-free)"
        assert answered["u"]["x_calibration"]["examples"] == 0
    finally:
        service.close()


def coloured(n: int, seed: int) -> list[dict[str, Any]]:
    """The right team is named by a colour word in the state (red: Alpha, green: Beta, blue: Gamma)
    among filler words: a rule the model's label readout does not follow but its hidden state carries."""
    rng = np.random.default_rng(seed)
    found = []
    for i in range(n):
        team, colour = (("Alpha", "red"), ("Beta", "green"), ("Gamma", "blue"))[i % 3]
        filler = " ".join(f"word{w}" for w in rng.integers(0, 89, 12))
        found.append(
            {"state": f"{filler} {colour} {colour} {colour}", "questions": {"team": TEAM}, "answers": {"team": team}}
        )
    return found


def test_a_probe_learns_a_rule_the_label_readout_misses_and_answers_by_it_bit_for_bit(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    service = served(tiny_chat_path, tmp_path)
    plain = served(tiny_chat_path, tmp_path / "elsewhere")
    uncached = served(tiny_chat_path, tmp_path, session_cache_entries=0)
    try:
        parsed = parse_examples(coloured(60, seed=0))
        evidence = answer_all(service, parsed, Progress(len(parsed), "examples", show=False)).evidence
        reports, records = fit_all(parsed, evidence, service.calibration, question_set=False)
        (report,) = (r.to_json() for r in reports)
        probes = ("probe/", "state_probe/")  # the colour is in the question's hidden vector and the state's mean
        assert report["method"].startswith(probes) and report["adopted"]
        readout_only = min(v for k, v in report["candidates"].items() if not k.startswith(probes))
        assert report["after"]["log_loss"] < readout_only and report["after"]["accuracy"] > 0.9
        assert service.calibration.store is not None
        service.calibration.store.put(records[0])
        right = 0
        for example in coloured(12, seed=1):  # new states
            request = SystemOneRequest.model_validate(body(example["state"], {"queue": TEAM}))
            miss, hit, off = service.answer(request), service.answer(request), uncached.answer(request)
            answer = miss.wire()["answers"]["queue"]
            assert answer["x_calibration"]["method"] == report["method"]
            if report["method"].startswith("state_probe/"):
                assert "x_raw" not in answer  # read from the state alone: no readout decoded
            else:
                unfitted = plain.answer(request).wire()["answers"]["queue"]["x_raw"]
                assert answer["x_raw"] == pytest.approx(unfitted, abs=1e-5)
            assert (miss.x_cache, hit.x_cache, off.x_cache) == ("miss", "hit", "off")
            assert len({json.dumps(r.wire()["answers"], sort_keys=True) for r in (miss, hit, off)}) == 1
            right += answer["choice"] == example["answers"]["team"]
        assert right >= 10
    finally:
        for s in (service, plain, uncached):
            s.close()


def test_a_state_probe_answers_bit_for_bit_hit_miss_off_and_after_a_restart_from_the_disk_tier(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    """A state probe reads the state's mean vector alone: its question is not read out (no suffix
    decoded, no raw answer or label mass), while a question beside it is, as without the fit. The disk
    tier keeps the mean: after a restart the state is a disk hit and answers as the first server did."""
    disk = {"session_cache_dir": tmp_path / "snapshots", "session_cache_disk_bytes": 1 << 30}
    service = served(tiny_chat_path, tmp_path, **disk)
    uncached = served(tiny_chat_path, tmp_path, session_cache_entries=0)
    try:
        parsed = parse_examples(coloured(60, seed=0))
        evidence = answer_all(service, parsed, Progress(len(parsed), "examples", show=False)).evidence
        assert all(e["team"].state_mean is not None for e in evidence)
        examples = [
            example_of(e["team"], p.answers["team"], sorted(e["team"].labels))
            for e, p in zip(evidence, parsed, strict=True)
        ]
        fit = ProbeCandidate(service.calibration.temperature, 0.001, "state_mean").fit(examples)
        assert service.calibration.store is not None
        requests = [SystemOneRequest.model_validate(body(e["state"], {"queue": TEAM})) for e in coloured(6, seed=1)]
        team = requests[0].questions["queue"]
        record = FitRecord(question_key(team), team.model_dump(mode="json"), "state_probe/0.001", fit, 60)
        service.calibration.store.put(record)
        first = []
        for request in requests:
            miss, hit, off = service.answer(request), service.answer(request), uncached.answer(request)
            assert (miss.x_cache, hit.x_cache, off.x_cache) == ("miss", "hit", "off")
            answer = miss.wire()["answers"]["queue"]
            assert answer["x_calibration"]["method"] == "state_probe/0.001"
            assert "x_raw" not in answer and "x_label_mass" not in answer
            assert miss.usage.input_tokens == len(service.plan(request).prefix.tokens)  # no suffix decoded
            assert len({json.dumps(r.wire()["answers"], sort_keys=True) for r in (miss, hit, off)}) == 1
            first.append(json.dumps(miss.wire()["answers"], sort_keys=True))
        state = coloured(6, seed=1)[0]["state"]
        both = SystemOneRequest.model_validate(body(state, {"queue": TEAM, "urgent": URGENT}))
        alone = SystemOneRequest.model_validate(body(state, {"urgent": URGENT}))
        beside, unfitted = service.answer(both).wire()["answers"], service.answer(alone).wire()["answers"]
        assert json.dumps({"queue": beside["queue"]}, sort_keys=True) == first[0]
        assert beside["urgent"]["x_label_mass"] > 0 and "x_calibration" not in beside["urgent"]
        assert beside["urgent"]["noul"] == pytest.approx(unfitted["urgent"]["noul"], abs=1e-5)
    finally:
        service.close()
        uncached.close()
    restarted = served(tiny_chat_path, tmp_path, **disk)
    try:
        for request, answered in zip(requests, first, strict=True):
            again = restarted.answer(request)
            assert again.x_cache == "disk"
            assert json.dumps(again.wire()["answers"], sort_keys=True) == answered
            assert restarted.answer(request).x_cache == "hit"
    finally:
        restarted.close()


def test_onepass_calibrate_compares_both_layouts_stores_both_and_says_which_to_serve(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    data = tmp_path / "examples.jsonl"
    data.write_text("\n".join(json.dumps(e) for e in examples(20)) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPASS_")}
    command = [sys.executable, "-m", "app", "calibrate", str(data), "--layout", "both", "-m", str(tiny_chat_path)]
    command += ["-t", "1", "--repack", "off", "--flash-attn", "off", "--session-cache-disk-bytes", "0"]
    command += ["--calibration-dir", str(tmp_path / "fits")]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [run["layout"] for run in runs] == ["state-first", "question-first"]
    assert all(run["fits"] for run in runs)
    assert len(list((tmp_path / "fits").rglob(f"*{SUFFIX}"))) == sum(len(run["fits"]) for run in runs)
    report = (tmp_path / "examples.report.md").read_text()
    assert "# Calibration fitted to your examples: tiny-chat, state-first" in report
    assert "# Calibration fitted to your examples: tiny-chat, question-first" in report
    table = report[report.index("## The two layouts") :]
    assert "| state-first |" in table and "| question-first |" in table
    for row in [line for line in table.splitlines() if line.startswith(("| state-first", "| question-first"))]:
        new_state, fitting = (float(cell) for cell in row.strip("|").split("|")[3:5])  # both measured, in seconds
        assert new_state > 0 and fitting > 0
    (recommended,) = [line for line in done.stdout.splitlines() if line.startswith("recommended layout: ")]
    layout = recommended.split()[2]
    assert layout in ("state-first", "question-first") and f"serve it with --layout {layout}" in recommended
    # each layout's server finds its own fits, and only its own
    for each in ("state-first", "question-first"):
        service = load_model(
            tiny_settings(tiny_chat_path, layout=each, calibration="contextual", calibration_dir=tmp_path / "fits")
        )
        try:
            ids = {fit["id"] for run in runs if run["layout"] == each for fit in run["fits"]}
            assert service.calibration.store is not None
            assert {record.id for record in service.calibration.store.records()} == ids
        finally:
            service.close()


def test_the_layout_recommendation_weighs_accuracy_against_cost() -> None:
    def run(layout: str, accuracy: float, seconds: float, served: float | None = None) -> LayoutRun:
        scores = {"accuracy": accuracy, "ece": 0.05, "brier": 0.1, "n": 10, "log_loss": 0.5, "reliability": []}
        return LayoutRun(layout, [{"before": scores, "after": scores}], seconds, served)

    assert recommend(run("state-first", 0.90, 3.0), run("question-first", 0.89, 2.0)).layout == "question-first"
    assert recommend(run("state-first", 0.90, 3.0), run("question-first", 0.85, 2.0)).layout == "state-first"
    assert recommend(run("state-first", 0.90, 2.0), run("question-first", 0.95, 3.0)).layout == "state-first"
    # a saving within COST_MARGIN does not pay for answers that depend on the question set
    close = recommend(run("state-first", 0.90, 3.0), run("question-first", 0.90, 2.8))
    assert close.layout == "state-first" and "0.93 of state-first's" in close.why
    # the cost as served with the fits decides, where it was measured: here fits made state-first cheap
    served = recommend(run("state-first", 0.90, 3.0, 1.0), run("question-first", 0.90, 2.0, 1.0))
    assert served.layout == "state-first"
    # at the same cost, a clear gain in accuracy pays for the dependence on the set; a small one does not
    gain = recommend(run("state-first", 0.90, 3.0, 1.0), run("question-first", 0.93, 2.0, 1.05))
    assert gain.layout == "question-first" and "more accurately" in gain.why
    assert recommend(run("state-first", 0.90, 3.0, 1.0), run("question-first", 0.91, 2.0, 1.0)).layout == "state-first"
    assert recommend(run("state-first", 0.90, 1.0, 1.0), run("question-first", 0.99, 2.0, 2.0)).layout == "state-first"
    assert recommend(run("state-first", 0.90, 3.0, 2.0), run("question-first", 0.90, 2.0, 1.0)).layout == (
        "question-first"
    )


def test_a_new_state_s_served_cost_is_measured_on_new_states_with_the_fits_on(
    fitted: tuple[Path, list[Any]], tiny_chat_path: Path
) -> None:
    folder, _ = fitted
    service = served(tiny_chat_path, folder)
    try:
        parsed = parse_examples([*examples(3), *examples(3)])  # three states, each twice
        for example in parsed:
            service.answer(example.request)  # every state now in the cache
        before = service.prefilled_tokens
        seconds = served_seconds(service, parsed, 5)
        assert len(seconds) == 3 and all(s > 0 for s in seconds)  # each distinct state once
        # each prefilled again from the base, as a new state is
        states = [len(service.plan(e.request).prefix.tokens) - service.base.n_tokens for e in parsed[:3]]
        assert service.prefilled_tokens - before == sum(states)
        # each was answered as new (a miss), and is in the cache again after
        assert all(service.answer(e.request).x_cache == "hit" for e in parsed)
        service.forget_state(parsed[0].request)
        assert service.answer(parsed[0].request).x_cache == "miss"
    finally:
        service.close()


def test_in_question_first_a_fit_answers_only_the_question_set_it_was_fitted_in(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    """A question-first prompt holds every question of the request, so what a fit read about one set
    is not what it would read in another: there the fit applies to its own set only. State-first
    prompts do not depend on the set, and a fit applies whatever else is asked."""
    parsed = parse_examples(examples(40))  # every example asks the team and urgent questions
    team, urgent = (parsed[0].request.questions[q] for q in ("team", "urgent"))
    for layout in ("state-first", "question-first"):
        service = served(tiny_chat_path, tmp_path / layout, layout=layout)
        try:
            evidence = answer_all(service, parsed, Progress(len(parsed), "examples", show=False)).evidence
            _, records = fit_all(parsed, evidence, service.calibration, question_set=False)
            keys = tuple(sorted({question_key(team), question_key(urgent)}))
            assert any(r is not None and r.key == question_key(team) for r in records)
            assert all(r.asked_with == keys for r in records if r is not None)
            assert service.calibration.store is not None
            for record in records:
                if record is not None:
                    service.calibration.store.put(record)
            state = "A ticket nobody has seen."
            asked: dict[str, dict[str, Any]] = {
                "its set": {"queue": TEAM, "urgent": URGENT},
                "its set, renamed": {"u": URGENT, "q": TEAM},
                "alone": {"queue": TEAM},
                "another set": {"queue": TEAM, "other": OTHER},
            }
            fitted = {
                name: "x_calibration" in answer
                for name, questions in asked.items()
                for qid, answer in service.answer(SystemOneRequest.model_validate(body(state, questions)))
                .wire()["answers"]
                .items()
                if qid in ("queue", "q")
            }
            if layout == "state-first":
                assert all(fitted.values()), fitted
            else:
                assert fitted == {"its set": True, "its set, renamed": True, "alone": False, "another set": False}
        finally:
            service.close()
    alone = [{**e, "questions": {"team": TEAM}, "answers": {"team": e["answers"]["team"]}} for e in examples(20)]
    mixed = parse_examples([*examples(20), *alone])
    service = served(tiny_chat_path, tmp_path / "mixed", layout="question-first")
    try:
        evidence = answer_all(service, mixed, Progress(len(mixed), "examples", show=False)).evidence
        _, records = fit_all(mixed, evidence, service.calibration, question_set=False)
        queue = next(r for r in records if r is not None and r.key == question_key(team))
        assert queue.asked_with is None  # fitted across sets: bound to none of them
        assert FitRecord.from_json(queue.to_json()) == queue
    finally:
        service.close()
