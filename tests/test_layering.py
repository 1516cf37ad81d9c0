"""The layering holds: app/'s subpackages import only the ones below them, the modules inside one
subpackage form no cycle, llama_cpp stays in one module and starlette in http/."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"

# Lowest first. The ground floor is app/'s own modules; a subpackage may import those and the
# subpackages of lower layers, never one of its own layer or above.
GROUND = {"config", "contract", "errors", "paths", "progress"}
LAYERS: list[set[str]] = [
    {"engine", "fleet"},  # llama.cpp and the snapshot tiers; the replicas' routing key and processes
    {"answering", "platform"},  # one model's request path; this machine (CPU, build, GPU check, tuning)
    {"serving"},  # settings per model, loading, the registry
    {"calibrate"},  # fitting calibration to a user's examples
    {"http"},  # the HTTP edge
    {"__main__"},  # the CLI
]


def modules() -> dict[str, Path]:
    """Every module by its dotted name under app ("engine.llama", "config", "__main__")."""
    found = {}
    for path in APP.rglob("*.py"):
        parts = path.relative_to(APP).with_suffix("").parts
        if parts[-1] != "__init__":
            found[".".join(parts)] = path
    return found


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(app modules imported, by dotted name under app; top-level third-party packages imported)."""
    internal, external = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "app":
                internal |= {alias.name for alias in node.names}
            elif node.module.startswith("app."):
                name = node.module.removeprefix("app.")
                if "." in name or (APP / f"{name}.py").is_file():
                    internal.add(name)
                else:  # from app.engine import llama: a module of a subpackage
                    internal |= {f"{name}.{alias.name}" for alias in node.names}
            else:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            external |= {alias.name.split(".")[0] for alias in node.names}
    return internal, external


def room(module: str) -> str:
    return module.split(".")[0]


def rank(module: str) -> int:
    if module in GROUND:
        return -1
    return next(i for i, layer in enumerate(LAYERS) if room(module) in layer)


def test_every_module_is_on_the_ground_floor_or_in_a_subpackage_of_a_layer() -> None:
    for module in modules():
        assert module in GROUND or "." in module or module == "__main__", f"app/{module}.py belongs in a subpackage"
        rank(module)  # raises if its subpackage has no layer
    assert {room(m) for m in modules() if "." in m} == set().union(*LAYERS) - {"__main__"}


def test_no_import_runs_back_up() -> None:
    for module, path in modules().items():
        internal, _ = imports(path)
        for target in internal:
            assert target in modules(), f"app/{module} imports app.{target}, which is not a module"
            if room(target) == room(module):
                continue  # inside one subpackage: checked for cycles below
            assert rank(target) < rank(module) or (module in GROUND and target in GROUND), (
                f"app/{module} imports app.{target} from its own layer or above"
            )


def test_the_modules_of_one_subpackage_form_no_cycle() -> None:
    graph = {module: {t for t in imports(path)[0] if room(t) == room(module)} for module, path in modules().items()}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as error:
        raise AssertionError(f"an import cycle: {error.args[1]}") from None


def test_llama_cpp_stays_in_one_module_and_starlette_in_the_http_edge() -> None:
    owners: dict[str, set[str]] = {"llama_cpp": set(), "starlette": set()}
    for module, path in modules().items():
        _, external = imports(path)
        for package in owners:
            if package in external:
                owners[package].add(module)
    assert owners["llama_cpp"] == {"engine.llama"}
    assert {room(module) for module in owners["starlette"]} == {"http"}
