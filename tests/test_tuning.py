"""Repacked weights: chosen by measurement and cached; with them on or off, hit == miss == cache off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.contract import SystemOneRequest
from app.tiny_gguf import write_tiny_gguf
from app.tuning import cache_dir, choose_repack, tuning_key
from tests.conftest import tiny_settings
from tests.loading import load_model

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer want money back?"},
    "team": {"type": "choice", "criteria": {"Billing": "money", "Shipping": "parcels", "Tech": None}},
    "anger": {"type": "score", "criteria": ["calm", "annoyed", "furious"]},
}


@pytest.fixture(scope="module")
def q4_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("q4") / "tiny-q4_0.gguf", seed=5, q4_0=True)


def test_the_choice_is_measured_once_then_read_from_the_cache(
    q4_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = choose_repack(q4_path, threads=1)
    stored = cache_dir() / f"{tuning_key(q4_path, 1)}.json"
    record = json.loads(stored.read_text())
    assert record["repack"] is first and record["plain_ms"] > 0 and record["repacked_ms"] > 0
    stored.write_text(json.dumps({"repack": not first}))  # a later start trusts what is cached ...
    assert choose_repack(q4_path, threads=1) is (not first)
    stored.write_text("{not json")  # ... unless it cannot be read: then it measures again
    again = choose_repack(q4_path, threads=1)
    remeasured = json.loads(stored.read_text())
    assert remeasured["repack"] is again and remeasured["plain_ms"] > 0  # a fresh measurement, not the stub
    assert tuning_key(q4_path, 1) != tuning_key(q4_path, 2)  # per thread count too


@pytest.mark.parametrize("repack", ["on", "off"])
def test_hit_miss_and_cache_off_are_bit_identical_with_repack(q4_path: Path, repack: str) -> None:
    cached = load_model(tiny_settings(q4_path, repack=repack))
    off = load_model(tiny_settings(q4_path, repack=repack, session_cache_entries=0))
    try:
        request = SystemOneRequest.model_validate({"model": "m", "state": "Charged twice!", "questions": QUESTIONS})
        miss, hit, disabled = cached.answer(request).wire(), cached.answer(request).wire(), off.answer(request).wire()
        assert (miss["x_cache"], hit["x_cache"], disabled["x_cache"]) == ("miss", "hit", "off")
        assert miss["answers"] == hit["answers"] == disabled["answers"]
        assert f"repack={int(repack == 'on')}" in cached.engine.kv_settings  # part of every cache key
    finally:
        cached.close()
        off.close()
