"""A fitting run survives what real example sets and real machines do to it (tiny model, real
llama.cpp): a question whose options vary from example to example (rare variants are reported, the
others fitted), a question whose fitting raises (the others are stored), and a run killed halfway
(it resumes from the evidence it kept and answers only the rest)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.calibration import MIN_LABELLED, question_key
from app.fitting.cli import main as calibrate_main
from app.fitting.examples import parse_examples, read_examples
from app.fitting.journal import SUFFIX as EVIDENCE_SUFFIX
from app.fitting.report import NO_MATPLOTLIB, reliability_png
from app.fitting.runner import fit_all
from app.http.server import create_app
from app.paths import REPO_ROOT
from app.serving.registry import ModelRegistry
from app.wire.contract import SystemOneRequest
from bench.policy_examples import examples as policy_examples
from tests.support.fit_faults import fail_fitting
from tests.support.loading import load_model
from tests.support.pipes import read_until
from tests.support.settings import tiny_settings

URGENT = {"type": "noul", "instructions": "Does this need a reply today?"}
# Each policy brings its own clauses, so "which clause was violated" is a different question per policy.
POLICIES = {
    "travel": (["Receipts", "Class of travel", "Approval"], 24),
    "gifts": (["Value limit", "Disclosure", "Timing", "Recipient"], 9),
    "leave": (["Notice", "Documentation"], 4),
    "security": (["Passwords", "Devices", "Sharing"], 3),
    "expenses": (["Per diem", "Alcohol", "Mileage"], 1),
}


def compliance(policies: dict[str, tuple[list[str], int]] = POLICIES) -> list[dict[str, Any]]:
    """States that each quote a policy and an act; the clause question's options are the policy's."""
    found = []
    for name, (clauses, count) in policies.items():
        for i in range(count):
            violated = clauses[i % len(clauses)]
            found.append(
                {
                    "state": f"Policy: {name}. Case {i}: the employee broke the rule on {violated.lower()}.",
                    "questions": {
                        "urgent": URGENT,
                        "clause": {
                            "type": "choice",
                            "instructions": "Which clause of the policy was violated?",
                            "criteria": {clause: None for clause in clauses},
                        },
                    },
                    "answers": {"urgent": i % 3 == 0, "clause": violated},
                }
            )
    return found


def clause_key(clauses: list[str]) -> str:
    request = compliance({"x": (clauses, 1)})[0]
    parsed = SystemOneRequest.model_validate({"model": "jev-latest", **{k: request[k] for k in ("state", "questions")}})
    return question_key(parsed.questions["clause"])


def test_a_question_whose_options_vary_fits_the_others_and_reports_its_rare_variants(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    service = load_model(tiny_settings(tiny_chat_path, calibration="contextual", calibration_dir=tmp_path))
    try:
        parsed = parse_examples(compliance())
        evidence = [service.evidence(example.request, hidden=True) for example in parsed]
        reports, records = fit_all(parsed, evidence, service.calibration, question_set=False)
    finally:
        service.close()
    shown = {r.key: r.to_json() for r in reports}
    urgent = next(r for r in shown.values() if r["ids"] == ["urgent"])
    assert urgent["labelled"] == 41 and urgent["folds"] == 5 and urgent["error"] is None
    for clauses, count in POLICIES.values():
        report = shown[clause_key(clauses)]
        assert report["labelled"] == count and report["error"] is None
        assert report["name"].startswith("clause [") and clauses[0] in report["name"]  # which variant it is
        if count < MIN_LABELLED:
            assert report["method"] == "contextual" and not report["adopted"] and report["folds"] is None
            assert (
                f"only {count} labelled example" in report["warning"]
                and f"at least {MIN_LABELLED}" in report["warning"]
            )
        else:
            assert report["folds"] == min(5, count // 2) and report["candidates"]
    assert "4 folds, not 5" in shown[clause_key(POLICIES["gifts"][0])]["warning"]
    stored = {record.key for record in records}
    assert stored <= {clause_key(POLICIES[n][0]) for n in ("travel", "gifts")} | {urgent["key"]}


def test_a_choice_whose_examples_never_pick_some_options_tries_no_per_label_fit(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    # 20 cases, each breaking one of the first two clauses only: nothing says the third is never right
    only_two = [e for e in compliance({"travel": (["Receipts", "Class of travel", "Approval"], 30)})]
    only_two = [e for e in only_two if e["answers"]["clause"] != "Approval"]
    service = load_model(tiny_settings(tiny_chat_path, calibration="contextual", calibration_dir=tmp_path))
    try:
        parsed = parse_examples(only_two)
        evidence = [service.evidence(example.request, hidden=True) for example in parsed]
        reports, _ = fit_all(parsed, evidence, service.calibration, question_set=True)
    finally:
        service.close()
    clause = next(r.to_json() for r in reports if r.ids == ["clause"])
    assert set(clause["candidates"]) == {"temperature", "batch"}
    assert "no example's answer is Approval (2 of 3 labels seen)" in clause["warning"]
    urgent = next(r.to_json() for r in reports if r.ids == ["urgent"])  # both answers seen: every candidate
    assert any(name.startswith("vector/") for name in urgent["candidates"])
    assert any(name.startswith("probe/") for name in urgent["candidates"])


def test_a_fit_that_raises_for_one_question_leaves_the_others_stored(
    tiny_chat_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = clause_key(POLICIES["travel"][0])
    fail_fitting(monkeypatch, broken)
    service = load_model(tiny_settings(tiny_chat_path, calibration="contextual", calibration_dir=tmp_path))
    settings = tiny_settings(tiny_chat_path, calibration_dir=tmp_path)
    with TestClient(create_app(settings, registry=ModelRegistry.serving(service))) as client:
        job = client.post("/v1/calibrations", json={"model": "jev-latest", "examples": compliance()}).json()
        client.app.state.runtime.fit_jobs.get(job["id"]).thread.join(120)  # type: ignore[attr-defined]
        done = client.get(f"/v1/calibrations/jobs/{job['id']}").json()
        assert done["status"] == "done, with errors" and done["error"] is None
        (error,) = done["errors"]
        assert error["key"] == broken and error["ids"] == ["clause"] and "fault injected" in error["error"]
        assert "Receipts" in error["name"]
        report = {r["key"]: r for r in done["report"]}
        assert report[broken]["error"] and not report[broken]["adopted"]
        stored = {fit["key"] for fit in client.get("/v1/calibrations").json()["fits"]}
        assert stored == {fit["key"] for fit in done["fits"]} and broken not in stored
        assert any(r["ids"] == ["urgent"] and r["key"] in stored for r in done["report"])
        # a second job on the same examples answers none of them again
        again = client.post("/v1/calibrations", json={"model": "jev-latest", "examples": compliance()}).json()
        client.app.state.runtime.fit_jobs.get(again["id"]).thread.join(120)  # type: ignore[attr-defined]
        assert client.get(f"/v1/calibrations/jobs/{again['id']}").json()["reused"] == len(compliance())
    service.close()


def calibrate(
    data: Path, model: Path, fits: Path, *harness: str, check: bool = True
) -> subprocess.Popen[str] | subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "tests.support.calibrate_harness",
        *harness,
        "--",
        str(data),
        "-m",
        str(model),
        "-t",
        "1",
        "--repack",
        "off",
        "--flash-attn",
        "off",
        "--session-cache-disk-bytes",
        "0",
        "--calibration-dir",
        str(fits),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPASS_")}
    if "--block-after" in harness:
        return subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=check)


def stored_fits(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    fits: list[dict[str, Any]] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")][-1][
        "fits"
    ]
    return fits


def test_a_killed_run_resumes_from_its_evidence_and_answers_only_the_rest(tiny_chat_path: Path, tmp_path: Path) -> None:
    examples = compliance()
    data = tmp_path / "examples.jsonl"
    data.write_text("\n".join(json.dumps(e) for e in examples) + "\n")
    killed = calibrate(data, tiny_chat_path, tmp_path / "fits", "--block-after", "12")
    assert isinstance(killed, subprocess.Popen)
    try:
        assert killed.stdout is not None
        assert read_until(killed.stdout, "\n", timeout=120).splitlines()[0] == "BLOCKED"
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
    assert killed.returncode == -signal.SIGKILL
    kept = sorted((tmp_path / "fits").rglob(f"*{EVIDENCE_SUFFIX}"))
    assert len(kept) == 12
    kept[0].write_text(kept[0].read_text().replace('"raw": [', '"raw": [0.5, ', 1))  # damaged: answered again

    resumed = calibrate(data, tiny_chat_path, tmp_path / "fits")
    assert isinstance(resumed, subprocess.CompletedProcess)
    assert f"reused the evidence of 11 of {len(examples)} examples" in resumed.stdout
    assert f"answered {len(examples) - 11}" in resumed.stderr.splitlines()[-1]
    assert "clause [Alcohol, Mileage, Per diem]: 1 labelled, kept contextual calibration" in resumed.stdout
    assert "only 1 labelled example: a fit needs at least" in resumed.stderr

    # what the resumed run fitted is what one uninterrupted run fits, to the bit (a fit's id is a
    # digest of its whole record, the file is named by it)
    fresh = calibrate(data, tiny_chat_path, tmp_path / "fresh")
    assert isinstance(fresh, subprocess.CompletedProcess)
    assert f"answered {len(examples)}" in fresh.stderr.splitlines()[-1]
    assert stored_fits(resumed) and stored_fits(resumed) == stored_fits(fresh)
    names = [sorted(p.name for p in (tmp_path / f).rglob("*.fit.json")) for f in ("fits", "fresh")]
    assert names[0] == names[1] == sorted(f"{fit['id']}.fit.json" for fit in stored_fits(fresh))

    again = calibrate(data, tiny_chat_path, tmp_path / "fits")
    assert isinstance(again, subprocess.CompletedProcess)
    assert "answered 0" in again.stderr.splitlines()[-1]
    assert stored_fits(again) == stored_fits(resumed)


def test_the_cli_reports_a_question_that_failed_and_stores_the_others(tiny_chat_path: Path, tmp_path: Path) -> None:
    data = tmp_path / "examples.jsonl"
    data.write_text("\n".join(json.dumps(e) for e in compliance()) + "\n")
    broken = clause_key(POLICIES["gifts"][0])
    done = calibrate(data, tiny_chat_path, tmp_path / "fits", "--fail-key", broken, check=False)
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 1 and "1 question(s) could not be fitted" in done.stderr
    assert "clause [Disclosure, Recipient, Timing, Value limit]: 9 labelled, NOT FITTED: RuntimeError" in done.stdout
    stored = stored_fits(done)
    assert stored and broken not in {fit["key"] for fit in stored}
    assert len(list((tmp_path / "fits").rglob("*.fit.json"))) == len(stored)
    report = (tmp_path / "examples.report.md").read_text()
    assert "## Errors" in report and broken in report


def test_an_example_the_server_would_refuse_is_named_in_one_line(tiny_chat_path: Path, tmp_path: Path) -> None:
    examples = compliance()[:3]
    examples[1] = {**examples[1], "state": "far too long " * 400}
    data = tmp_path / "examples.jsonl"
    data.write_text("\n".join(json.dumps(e) for e in examples) + "\n")
    flags = ["-m", str(tiny_chat_path), "-t", "1", "-c", "512", "--session-cache-disk-bytes", "0"]
    with pytest.raises(SystemExit) as stopped:
        calibrate_main([str(data), *flags, "--calibration-dir", str(tmp_path / "fits")])
    assert str(stopped.value.code).startswith("onepass calibrate: line 2: the prompt needs")


def test_a_bad_example_is_named_by_its_line_blank_lines_counted(tmp_path: Path) -> None:
    good, bad = compliance()[:2]
    data = tmp_path / "examples.jsonl"
    data.write_text("\n".join([json.dumps(good), "", "", json.dumps({**bad, "answers": {"clause": "Sales"}})]) + "\n")
    with pytest.raises(SystemExit) as stopped:
        calibrate_main([str(data), "--calibration-dir", str(tmp_path / "fits")])
    assert str(stopped.value.code).startswith("onepass calibrate: line 4: answers.clause: 'Sales' is not one of")


def test_the_report_says_when_it_has_no_reliability_diagram(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scored = {"ece": 0.1, "reliability": [{"from": 0.5, "to": 0.6, "n": 3, "confidence": 0.55, "accuracy": 0.67}]}
    reports = [{"name": "q", "before": scored, "after": scored}]
    assert reliability_png(reports, tmp_path / "drawn.png") == "Reliability diagram: drawn.png"
    assert (tmp_path / "drawn.png").read_bytes().startswith(b"\x89PNG")
    assert reliability_png([{"name": "q", "before": None}], tmp_path / "none.png").startswith("No reliability diagram")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` meets where it is not installed
    assert reliability_png(reports, tmp_path / "missing.png") == NO_MATPLOTLIB
    assert not (tmp_path / "missing.png").exists()


def test_the_shipped_examples_are_in_calibrates_format_as_their_generator_made_them() -> None:
    text = (REPO_ROOT / "examples" / "calibration.jsonl").read_text(encoding="utf-8")
    parsed = read_examples(text)
    assert len(parsed) == 40 and all(set(example.answers) == set(example.request.questions) for example in parsed)
    # docs/calibration.md names the command that made them
    assert [json.loads(line) for line in text.splitlines()] == policy_examples(40, 0, ["tickets"])
