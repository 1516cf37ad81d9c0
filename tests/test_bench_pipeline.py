"""The pipeline scenario of `make bench` (bench/pipeline.py) end to end on the tiny model: both
layouts served over real sockets, the report's numbers derived from what was measured."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.config import LAYOUTS
from app.serving.registry import ModelRegistry
from bench import pipeline
from tests.support.live import RunningServer
from tests.support.loading import load_model
from tests.support.settings import tiny_settings


@contextmanager
def tiny_server(model: Path, *flags: str) -> Iterator[tuple[str, int]]:
    """bench.servers' onepass_server, in-process: the bench passes only `--layout NAME`."""
    assert flags[0] == "--layout" and len(flags) == 2
    settings = tiny_settings(model, layout=flags[1])
    registry = ModelRegistry.serving(load_model(settings))
    server = RunningServer(settings, registry)
    try:
        yield server.base_url, 0
    finally:
        server.stop()
        registry.close()


def test_the_pipeline_scenario_measures_both_layouts_and_what_readouts_leave(tiny_chat_path: Path) -> None:
    found: dict[str, Any] = pipeline.pipeline(tiny_chat_path, 3, tiny_server)

    assert list(found["layouts"]) == list(LAYOUTS)
    state_first, question_first = (found["layouts"][name] for name in LAYOUTS)
    for r in (state_first, question_first):
        assert 0 < r["steady_decode_ms"] < r["steady_ms"] and 0 < r["steady_prefill_ms"] < r["steady_ms"]
        assert r["steady_engine_prefill_plus_decode_ms"] <= r["steady_ms"]
    # The question-first suffixes are readouts: the question blocks sit in the shared prefix.
    assert question_first["input_tokens"] != state_first["input_tokens"]
    assert found["steady_speedup"] == round(state_first["steady_ms"] / question_first["steady_ms"], 2)
    without_readouts = question_first["steady_ms"] - question_first["steady_decode_ms"]
    assert found["speedup_with_free_readouts"] == round(state_first["steady_ms"] / without_readouts, 2)
    assert found["speedup_with_free_readouts"] > found["steady_speedup"]
    assert found["readout_budget_for_3x_ms"] == round(state_first["steady_ms"] / 3 - without_readouts, 1)

    text = "\n".join(pipeline.markdown(found))
    assert f"| question-first | {question_first['first_ms']} | {question_first['steady_ms']} |" in text
    assert f"With readouts that cost nothing it would be {found['speedup_with_free_readouts']}x" in text
