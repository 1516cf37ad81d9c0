"""The layering holds: each module imports only the layers below it, and two imports stay in one module."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"

# Lowest first. A module may import app modules of lower layers only: no import runs back up.
LAYERS: list[set[str]] = [
    {
        "errors",
        "progress",
        "snapshot",
        "scoring",
        "contract",
        "paths",
        "cpu",
        "tiny_gguf",
        "observability",
        "fitting",
        "fit_report",
    },
    {"config", "fingerprint", "launch"},
    {"cache", "engine", "prompting", "known_models", "body", "openapi", "doctor", "affinity", "fleet", "fits"},
    {"model_config", "calibration", "build_check", "check_gpu", "disk_tier", "decision"},
    {"tuning"},
    {"service"},
    {"loading", "fit_runner"},
    {"models", "fit_jobs", "calibrate_cli"},
    {"server"},
    {"__main__"},
]


def app_imports(path: Path) -> tuple[set[str], set[str]]:
    """(app modules imported, top-level third-party packages imported), anywhere in the file."""
    internal, external = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "app":
                internal |= {alias.name for alias in node.names}
            elif node.module.startswith("app."):
                internal.add(node.module.split(".")[1])
            else:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            external |= {alias.name.split(".")[0] for alias in node.names}
    return internal, external


def test_every_module_has_a_layer() -> None:
    modules = {p.stem for p in APP.glob("*.py")} - {"__init__"}
    assert modules == set().union(*LAYERS)


def test_no_import_runs_back_up() -> None:
    rank = {module: i for i, layer in enumerate(LAYERS) for module in layer}
    for path in APP.glob("*.py"):
        if path.stem == "__init__":
            continue
        internal, _ = app_imports(path)
        upward = {m for m in internal if rank[m] >= rank[path.stem]}
        assert not upward, f"app/{path.name} imports {sorted(upward)} from its own layer or above"


def test_llama_cpp_and_starlette_each_stay_in_one_module() -> None:
    owners: dict[str, set[str]] = {"llama_cpp": set(), "starlette": set()}
    for path in APP.glob("*.py"):
        _, external = app_imports(path)
        for package in owners:
            if package in external:
                owners[package].add(path.stem)
    assert owners == {"llama_cpp": {"engine"}, "starlette": {"server"}}
