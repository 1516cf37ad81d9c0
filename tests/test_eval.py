"""The eval pipeline (bench/eval.py) end to end on the tiny model: metrics, not accuracy."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import eval as evaluation

ITEMS = evaluation.load_items()


def test_the_labelled_set_is_large_balanced_and_well_formed() -> None:
    assert len(ITEMS) >= 150
    assert len({item["id"] for item in ITEMS}) == len(ITEMS)
    kinds = [item["question"]["type"] for item in ITEMS]
    assert min(kinds.count(k) for k in ("noul", "choice", "score")) >= 30
    nouls = [item["answer"] for item in ITEMS if item["question"]["type"] == "noul"]
    assert abs(nouls.count(True) - nouls.count(False)) <= 1
    for item in ITEMS:
        question, answer = item["question"], item["answer"]
        if question["type"] == "choice":
            assert answer in question["criteria"]
        elif question["type"] == "score":
            assert 0 <= answer < len(question["criteria"])
    assert sum(isinstance(item["state"], dict | list) for item in ITEMS) >= 15


def test_metrics_follow_their_definitions() -> None:
    right = evaluation.Outcome("a", "noul", "c", [0.9, 0.1], 0, 1.0)
    wrong = evaluation.Outcome("b", "choice", "c", [0.3, 0.7], 0, 0.5)
    m = evaluation.metrics([right, wrong])
    assert m["accuracy"] == 0.5 and m["accuracy_by_type"] == {"noul": 1.0, "choice": 0.0}
    assert m["brier"] == pytest.approx(((0.1**2 + 0.1**2) + (0.7**2 + 0.7**2)) / 2)
    assert m["ece"] == pytest.approx((abs(1 - 0.9) + abs(0 - 0.7)) / 2)
    assert m["label_mass"]["min"] == 0.5


def test_make_eval_runs_the_real_server_path_and_writes_its_reports(
    tiny_chat_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["eval", "--model", str(tiny_chat_path), "--limit", "12", "--out", str(tmp_path)])
    evaluation.main()
    report = json.loads((tmp_path / "eval-tiny-chat.json").read_text())
    assert set(report["results"]) == {"raw", "calibrated"}
    for result in report["results"].values():
        assert result["items"] == 12
        assert 0 <= result["accuracy"] <= 1 and 0 <= result["ece"] <= 1 and math.isfinite(result["brier"])
        assert sum(row["count"] for row in result["reliability"]) == 12
    assert "| calibrated |" in (tmp_path / "eval-tiny-chat.md").read_text()
    assert (tmp_path / "eval-tiny-chat.png").read_bytes().startswith(b"\x89PNG")
