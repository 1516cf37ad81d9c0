"""Speed settings (threads, repacked weights, flash attention): chosen by measurement and cached;
with repacked weights and flash attention each on or off, hit == miss == cache off."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.engine.bindings import shipped_backends
from app.paths import prune_records
from app.platform.tiny_gguf import write_tiny_gguf
from app.platform.tuning import cache_dir, choose, choose_threads, describe, read_record, tuning_key
from app.serving.loading import SpeedSettings, speed_settings_for
from app.serving.specs import ModelSpec
from app.wire.contract import SystemOneRequest
from tests.support.loading import load_model
from tests.support.settings import tiny_settings

QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer want money back?"},
    "team": {"type": "choice", "criteria": {"Billing": "money", "Shipping": "parcels", "Tech": None}},
    "anger": {"type": "score", "criteria": ["calm", "annoyed", "furious"]},
}


@pytest.fixture(scope="module")
def q4_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("q4") / "tiny-q4_0.gguf", seed=5, q4_0=True)


@pytest.mark.parametrize(
    ("setting", "fixed", "name"), [("repack", {}, "repack"), ("flash_attn", {"repack": True}, "flash_attn-repack=1")]
)
def test_the_choice_is_measured_once_then_read_from_the_cache(
    q4_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str, fixed: dict[str, bool], name: str
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = choose(q4_path, 1, setting, fixed)
    stored = cache_dir() / f"{tuning_key(q4_path, 1)}-{name}.json"
    record = json.loads(stored.read_text())
    assert record["on"] is first and record["off_ms"] > 0 and record["on_ms"] > 0
    stored.write_text(json.dumps({"on": not first}))  # a later start trusts what is cached ...
    assert choose(q4_path, 1, setting, fixed) is (not first)
    stored.write_text("{not json")  # ... unless it cannot be read: then it measures again
    again = choose(q4_path, 1, setting, fixed)
    remeasured = json.loads(stored.read_text())
    assert remeasured["on"] is again and remeasured["off_ms"] > 0  # a fresh measurement, not the stub
    assert tuning_key(q4_path, 1) != tuning_key(q4_path, 2)  # per thread count too
    assert [path.name for path in cache_dir().iterdir()] == [stored.name]  # no partial file left


def test_describe_reads_the_cache_and_measures_nothing(
    q4_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert describe(q4_path, 1) == "repack not measured yet"
    assert not cache_dir().exists()
    repack = choose(q4_path, 1, "repack")
    assert describe(q4_path, 1).startswith(f"repack {'on' if repack else 'off'} (")
    assert describe(q4_path, 1).endswith("; flash_attn not measured yet")
    flash_attn = choose(q4_path, 1, "flash_attn", {"repack": repack})
    assert f"; flash_attn {'on' if flash_attn else 'off'} (" in describe(q4_path, 1)


def test_threads_are_measured_only_where_cores_and_cpus_differ(
    q4_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr("app.platform.tuning.thread_counts", lambda: (2, 2))
    assert choose_threads(q4_path) == 2 and not cache_dir().exists()  # nothing to choose, nothing timed
    monkeypatch.setattr("app.platform.tuning.thread_counts", lambda: (1, 2))  # a core with two hyperthreads
    assert describe(q4_path) == "threads (1 cores, 2 CPUs) not measured yet"
    first = choose_threads(q4_path)
    stored = cache_dir() / f"{tuning_key(q4_path, 0)}-threads-1-2.json"
    record = json.loads(stored.read_text())
    assert first == (2 if record["on"] else 1) and record["off_ms"] > 0 and record["on_ms"] > 0
    assert describe(q4_path).startswith(f"{first} threads (")
    stored.write_text(json.dumps({"on": first == 1}))  # a later start trusts what is cached
    assert choose_threads(q4_path) == 3 - first


def test_only_the_newest_records_are_kept(q4_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache_dir().mkdir(parents=True)
    for age in range(6):  # records of older builds, older first; one in the format before per-setting records
        old = cache_dir() / (f"{age:024x}.json" if age == 0 else f"{age:024x}-repack.json")
        old.write_text(json.dumps({"on": False}))
        os.utime(old, ns=(age * 10**9, age * 10**9))
    read_record(cache_dir() / f"{1:024x}-repack.json")  # reading one makes it the most recently used
    prune_records(cache_dir(), keep=4)
    assert sorted(p.name for p in cache_dir().iterdir()) == [f"{age:024x}-repack.json" for age in (1, 3, 4, 5)]
    monkeypatch.setattr("app.platform.tuning.KEEP_RECORDS", 3)
    choose(q4_path, 1, "repack")  # writing a record prunes: it and the two newest before it stay
    kept = sorted(p.name for p in cache_dir().iterdir())
    assert kept == sorted([f"{tuning_key(q4_path, 1)}-repack.json", f"{1:024x}-repack.json", f"{5:024x}-repack.json"])


@pytest.mark.parametrize(("repack", "flash_attn"), [("off", "off"), ("on", "off"), ("off", "on"), ("on", "on")])
def test_hit_miss_and_cache_off_are_bit_identical_with_each_speed_setting(
    q4_path: Path, repack: str, flash_attn: str
) -> None:
    cached = load_model(tiny_settings(q4_path, repack=repack, flash_attn=flash_attn))
    off = load_model(tiny_settings(q4_path, repack=repack, flash_attn=flash_attn, session_cache_entries=0))
    try:
        # long enough that ggml's flash attention takes its tiled path (64 rows or more) for the state
        state = "Charged twice for one order, and nobody answers my emails. " * 12
        request = SystemOneRequest.model_validate({"model": "m", "state": state, "questions": QUESTIONS})
        miss, hit, disabled = cached.answer(request).wire(), cached.answer(request).wire(), off.answer(request).wire()
        assert (miss["x_cache"], hit["x_cache"], disabled["x_cache"]) == ("miss", "hit", "off")
        assert miss["answers"] == hit["answers"] == disabled["answers"]
        # both are part of every cache key
        assert f"repack={int(repack == 'on')}" in cached.engine.kv_settings
        assert f"flash_attn={flash_attn}" in cached.engine.kv_settings
    finally:
        cached.close()
        off.close()


def test_flash_attention_reaches_llama_cpp(q4_path: Path) -> None:
    """The fused kernel rounds differently, so the same request answered with and without it
    differs: the setting is applied (else the test above would prove nothing about it)."""
    request = SystemOneRequest.model_validate({"model": "m", "state": "Charged twice!", "questions": QUESTIONS})
    found = []
    for flash_attn in ("off", "on"):
        service = load_model(tiny_settings(q4_path, flash_attn=flash_attn))
        try:
            found.append(service.answer(request).wire()["answers"])
        finally:
            service.close()
    assert found[0] != found[1]


def test_layers_on_a_gpu_take_auto_flash_attention_on_cuda_only_and_never_repacked_weights(q4_path: Path) -> None:
    """Nothing is timed for them: 'auto' flash attention is on where the build's GPU backend is CUDA (measured
    there, docs/gpu.md) and off on any other; 'on' and 'off' are as set."""
    cuda = "cuda" in shipped_backends()
    for flash_attn, expected in (("auto", cuda), ("on", True), ("off", False)):
        spec = ModelSpec.from_settings(tiny_settings(q4_path, n_gpu_layers=-1, repack="on", flash_attn=flash_attn))
        assert speed_settings_for(spec) == SpeedSettings(1, False, expected)
