"""bench/ has layers too: shared pieces at the bottom, scenarios above them, `make bench`'s
orchestrator (run.py) on top, imported by nothing."""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import bench_imports, imported_modules

BENCH = Path(__file__).resolve().parent.parent / "bench"

# Lowest first. A module may import bench modules of lower layers only.
LAYERS: list[set[str]] = [
    # shared pieces
    {"output", "client", "servers", "pipelines", "peer", "browser", "twin", "policy_examples"},
    {"figure", "workloads", "screenshot", "evidence"},
    # scenarios
    {
        "eval",
        "fleet_sim",
        "calibration_study",
        "probe_cost",
        "load",
        "pipeline",
        "restart",
        "shared_suffixes",
        "image_states",
        "priority_facts",
        "cross_request_exactness",
        "shared_decode_cost",
        "impatient",
        "prefills_together",
    },
    # what builds on a scenario's pieces: the labelling loop on calibration_study's evidence
    {"labelling"},
    # make bench; what reads the eval set or compares its reports, or compares onepass with llama.cpp
    {"run", "compare_evals", "native_template", "native_decision"},
    {"native_speed"},  # onepass and llama.cpp's /v1/systemone on speed: reads native_decision's agreement
    # in-process measures on native_speed's questions: where its new states go, what the layer tap costs;
    # and many clients at once on native_speed's two servers
    {"new_state_cost", "tap_cost", "throughput"},
]


def modules() -> list[Path]:
    return [path for path in BENCH.glob("*.py") if path.stem != "__init__"]


def test_every_bench_module_has_a_layer() -> None:
    assert {path.stem for path in modules()} == set().union(*LAYERS)


def test_no_bench_import_runs_back_up_and_nothing_imports_the_orchestrator() -> None:
    rank = {module: i for i, layer in enumerate(LAYERS) for module in layer}
    for path in modules():
        imported = bench_imports(path)
        assert "run" not in imported, f"bench/{path.name} imports bench/run.py"
        upward = {m for m in imported if rank[m] >= rank[path.stem]}
        assert not upward, f"bench/{path.name} imports {sorted(upward)} from its own layer or above"


def test_the_bench_imports_nothing_from_the_tests() -> None:
    """The bench runs from a checkout on top of app/; what it shares with the tests (the tiny models, their
    images) lives in app/platform/, so that a test helper's change never moves a measurement."""
    for path in modules():
        taken = sorted(module for module in imported_modules(path) if module.split(".")[0] == "tests")
        assert not taken, f"bench/{path.name} imports {taken}"
