"""The layering holds: app/'s subpackages import only the ones below them, the modules inside one
subpackage form no cycle, llama_cpp stays in the engine's bindings (and libmtmd's in its vision path)
and starlette in http/, and the
engine's context pool stays inside the engine. The calibration room is entered through its face
only, a name is imported from the module that defines it (no module hands on what it imported), and
a long module is named as a prompt to split it by what it holds. Tests build Settings that keep out
of the user's fits."""

from __future__ import annotations

import ast
import re
import tomllib
import warnings
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from tests.support.floor_plan import GROUND, LAYERS
from tests.support.imports import imported_modules

APP = Path(__file__).resolve().parent.parent / "app"
# The ops tools (tools/README.md) and the bench run from a checkout on top of app/, which is installed alone.
TOOLS = APP.parent / "tools"
BENCH = APP.parent / "bench"
TESTS = APP.parent / "tests"


# Rooms entered through their face (their __init__.py) only: code outside imports the names it
# hands on, never one of the room's modules.
FACED = {"calibration"}
# A module longer than this may hold more than one thing: the test names it, as a prompt to split it
# along what it holds (a concept of its own gets a module of its own), never as a target to trim
# lines toward. Past LONGEST it fails: no one thing in app/ has needed that many.
SPLIT_PROMPT_LINES = 400
LONGEST = 600
# Where code that imports app/ lives: each may import a name of app/ only from where it is defined.
IMPORTERS = [APP, TOOLS, BENCH, APP.parent / "tests", APP.parent / "models"]


def modules() -> dict[str, Path]:
    """Every module by its dotted name under app ("engine.llama", "config", "__main__"); a faced room's
    face by the room's name ("calibration")."""
    found = {}
    for path in APP.rglob("*.py"):
        parts = path.relative_to(APP).with_suffix("").parts
        if parts[-1] != "__init__":
            found[".".join(parts)] = path
        elif parts[:-1] and parts[0] in FACED:
            found[parts[0]] = path
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
                elif name in FACED:  # from app.calibration import Calibration: the room's face
                    for alias in node.names:
                        is_module = (APP / name / f"{alias.name}.py").is_file()
                        internal.add(f"{name}.{alias.name}" if is_module else name)
                else:  # from app.engine import engine: a module of a subpackage
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
        assert module in GROUND | FACED or "." in module or module == "__main__", (
            f"app/{module}.py belongs in a subpackage"
        )
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
    assert owners["llama_cpp"] == {"engine.bindings", "engine.vision"}
    assert {room(module) for module in owners["starlette"]} == {"http"}
    # the images path takes libmtmd's bindings, and nothing else of llama_cpp
    assert llama_cpp_modules(modules()["engine.vision"]) == {"llama_cpp.mtmd_cpp"}


def llama_cpp_modules(path: Path) -> set[str]:
    """The llama_cpp modules a module imports, by their dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "llama_cpp":
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "llama_cpp"}
    return found


def test_nothing_outside_the_engine_reaches_its_context_pool() -> None:
    """Contexts are the engine's to lend: whatever else holds one could decode past the engine. What
    a context raises (a restore that failed) is caught outside, so errors are the one thing taken from
    the pool and the context modules."""
    outside = {f"app/{m}": path for m, path in modules().items() if room(m) != "engine"}
    outside |= {
        f"{folder.name}/{path.relative_to(folder)}": path for folder in (TOOLS, BENCH) for path in folder.rglob("*.py")
    }
    for name, path in outside.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "app.engine":
                reached = {alias.name for alias in node.names} & {"pool", "context"}
                assert not reached, f"{name} imports app.engine.{reached}"
            if isinstance(node, ast.ImportFrom) and node.module in ("app.engine.pool", "app.engine.context"):
                taken = [alias.name for alias in node.names if not alias.name.endswith("Error")]
                assert not taken, f"{name} takes {taken} from {node.module}"


def test_a_faced_room_is_entered_through_its_face_only() -> None:
    for module, path in modules().items():
        for target in imports(path)[0]:
            if room(target) in FACED and room(module) != room(target):
                assert target == room(target), f"app/{module} reaches into app.{target}: import from app.{room(target)}"


def defined_and_imported(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(the names a module defines at its top level, the names it imports there), conditional blocks
    (`if TYPE_CHECKING:`, `try:`) included."""
    defined: set[str] = set()
    imported: set[str] = set()
    statements: list[ast.stmt] = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imported |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.If | ast.Try):
            statements += [*node.body, *node.orelse, *getattr(node, "handlers", []), *getattr(node, "finalbody", [])]
        elif isinstance(node, ast.ExceptHandler):
            statements += node.body
    return defined, imported


def test_a_name_is_imported_from_the_module_that_defines_it() -> None:
    """A module that hands on a name it imported (a re-export) hides who depends on whom: its importers
    seem to lean on it alone. Whoever needs a name imports it from where it is defined. A faced room's
    face is the one door meant to hand names on."""
    trees: dict[str, ast.Module] = {}
    for module, path in modules().items():
        if module not in FACED:
            trees[f"app.{module}"] = ast.parse(path.read_text())
    handed_on = []
    for folder in IMPORTERS:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.module in trees):
                    continue
                defined, imported = defined_and_imported(trees[node.module])
                package = APP.joinpath(*node.module.split(".")[1:])
                for alias in node.names:
                    if alias.name in imported - defined and not (package / f"{alias.name}.py").is_file():
                        where = path.relative_to(APP.parent)
                        handed_on.append(f"{where}:{node.lineno}: {alias.name} from {node.module}, which imports it")
    assert not handed_on, "names imported from a module that only hands them on:\n" + "\n".join(handed_on)


def test_a_long_module_is_a_prompt_to_split_it_by_what_it_holds() -> None:
    lines = {f"app/{path.relative_to(APP)}": len(path.read_text().splitlines()) for path in APP.rglob("*.py")}
    assert len(lines) > 70  # every module read, faces too
    for name, n in sorted(lines.items()):
        if n > SPLIT_PROMPT_LINES:
            warnings.warn(
                f"{name} has {n} lines: if it holds more than one thing, split it along what it holds; "
                "trimming lines to stay under a number is not the point",
                stacklevel=1,
            )
    longest = {name: n for name, n in lines.items() if n > LONGEST}
    assert not longest, f"modules over {LONGEST} lines, each surely more than one thing: {longest}"


def test_the_service_keeps_its_calibration_to_itself() -> None:
    """Nothing outside the calibration room reads what a model's calibration keeps inside."""
    inside = ("calibration_temperature", "calibrator", "fits", "calibration.priors", "calibration._")
    for module, path in modules().items():
        if room(module) != "calibration":
            text = path.read_text()
            for name in inside:
                assert f"service.{name}" not in text, f"app/{module} reads service.{name}"


def test_the_model_service_has_no_long_method() -> None:
    """ModelService plans, resolves the prefix, decodes, calibrates and renders: each a call of its own."""
    tree = ast.parse((APP / "answering" / "service.py").read_text())
    (service,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ModelService"]
    for method in service.body:
        if isinstance(method, ast.FunctionDef) and method.end_lineno is not None:
            lines = method.end_lineno - method.lineno + 1
            assert lines <= 40, f"ModelService.{method.name} is {lines} lines long"


def test_app_never_imports_the_tools_the_bench_or_the_tests() -> None:
    for module, path in modules().items():
        outside = imports(path)[1] & {"tools", "bench", "tests"}
        assert not outside, f"app/{module} imports {sorted(outside)}"


def test_the_tools_stand_on_app_alone() -> None:
    """A tool may import app/ and the standard library's or a dependency's packages, never the bench or tests.
    A tool of several modules is a package in a folder of its own (tools/api_examples/): its modules too."""
    for path in TOOLS.rglob("*.py"):
        outside = imports(path)[1] & {"bench", "tests"}
        assert not outside, f"tools/{path.relative_to(TOOLS)} imports {sorted(outside)}"


def test_tests_build_settings_that_keep_out_of_the_users_fits() -> None:
    """Settings() looks for fits in the user's cache folder, where `onepass calibrate` leaves fits of the
    real model that would change its answers under test; tests build Settings with
    tests/support/settings.py's isolated_settings (test_config.py checks the defaults themselves)."""
    direct = re.compile(r"(?<![A-Za-z_])Settings\(")
    allowed = {"support/settings.py", "test_config.py", "test_layering.py"}
    for path in TESTS.rglob("*.py"):
        name = path.relative_to(TESTS).as_posix()
        if name not in allowed:
            assert not direct.search(path.read_text()), f"tests/{name} builds Settings(...): use isolated_settings"


def is_test_module(module: str) -> bool:
    """Whether the dotted name is one of tests/' test modules (or its conftest): pytest's to collect."""
    parts = module.split(".")
    return parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")


def test_no_test_module_imports_another() -> None:
    """What more than one test module uses lives in tests/support/: a test module is a spec to read on its
    own, and one that imports another drags in that one's fixtures, tests and module-level setup."""
    assert is_test_module("tests.test_decision") and is_test_module("tests.conftest")
    assert not is_test_module("tests.support.decision_cases")
    for path in sorted(TESTS.rglob("*.py")):
        found = sorted(module for module in imported_modules(path) if is_test_module(module))
        assert not found, f"tests/{path.relative_to(TESTS)} imports {found}: move what it shares into tests/support/"


def test_every_room_is_installed() -> None:
    """A room missing from pyproject's packages is there in a checkout and gone from an installed onepass."""
    declared = set(tomllib.loads((APP.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    rooms = {".".join(("app", *p.parent.relative_to(APP).parts)) for p in APP.rglob("__init__.py")}
    assert rooms - declared == set(), f"pyproject.toml's packages leave out {sorted(rooms - declared)}"
