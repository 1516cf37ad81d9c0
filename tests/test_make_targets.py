"""Every make target installs what the programs it runs import: `make run` installs onepass's dependencies
only (pyproject's [project] dependencies), $(DEV_STAMP) adds the dev extras and $(BENCH_STAMP) the dev and
bench ones, and $(PYTHON), the interpreter the venv is made from, has nothing but the standard library.

Read from the Makefile (nothing is built): each recipe's `$(BIN)/python -m MODULE` (or a script) and what
the target's prerequisites install, then the modules imported in a subprocess in which every installed
distribution outside that set cannot be imported, as if it were not installed."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement

from app.paths import REPO_ROOT

# What each stamp installs into the venv: None for a venv with nothing in it yet.
STAMPS = {"$(INSTALL_STAMP)": (), "$(DEV_STAMP)": ("dev",), "$(BENCH_STAMP)": ("dev", "bench")}
RUN = re.compile(r"(?P<python>\$\(BIN\)/python|\$\(PYTHON\))\s+(?:-m\s+(?P<module>[\w.]+)|(?P<script>[\w./-]+\.py))")
RULE = re.compile(r"([^\s:=#][^:=#]*?)\s*::?(?!=)(.*)")
NOT_A_RULE = ("ifeq", "ifneq", "else", "endif", "include", "-include", "export", "$(error")


@dataclass(frozen=True)
class Rule:
    prerequisites: tuple[str, ...]
    recipe: tuple[str, ...]


@cache
def rules() -> dict[str, Rule]:
    """The Makefile's rules by target, continued lines joined (order-only prerequisites too)."""
    found: dict[str, Rule] = {}
    targets: list[str] = []
    recipe: list[str] = []
    lines = (REPO_ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ").splitlines()
    for line in [*lines, ""]:
        if line.startswith("\t"):
            recipe.append(line.strip())
            continue
        for target in targets:
            found[target] = Rule(found[target].prerequisites, tuple(recipe))
        targets, recipe = [], []
        matched = RULE.match(line)
        if matched is not None and not line.startswith(NOT_A_RULE):
            prerequisites = tuple(matched[2].split("#")[0].replace("|", " ").split())
            targets = matched[1].split()
            found.update((target, Rule(prerequisites, ())) for target in targets)
    return found


def installed_for(target: str, seen: frozenset[str] = frozenset()) -> tuple[str, ...] | None:
    """The extras the target's prerequisites install (() for onepass's dependencies alone), None for none."""
    extras: tuple[str, ...] | None = None
    for prerequisite in rules()[target].prerequisites if target in rules() else ():
        found = STAMPS.get(prerequisite)
        if found is None and prerequisite in rules() and prerequisite not in seen:
            found = installed_for(prerequisite, seen | {target})
        if found is not None:
            extras = tuple(sorted({*(extras or ()), *found}))
    return extras


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def distributions(extras: tuple[str, ...] | None) -> frozenset[str]:
    """The distributions installed by onepass with `extras` (None: none at all), with their dependencies."""
    if extras is None:
        return frozenset({"onepass"})
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [*project["dependencies"], *(r for extra in extras for r in project["optional-dependencies"][extra])]
    found, queue = {"onepass"}, [(Requirement(text), "") for text in wanted]
    while queue:
        requirement, extra = queue.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        try:
            needs = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed in this venv either: nothing imports it here
        if normal(requirement.name) in found and not requirement.extras:
            continue
        found.add(normal(requirement.name))
        queue += [(Requirement(text), e) for text in needs for e in (requirement.extras or {""})]
    return frozenset(found)


# Runs in a subprocess: a distribution outside the allowed ones cannot be imported, then each program's
# modules are imported (a script is run under another name, so that its main() does not run).
BLOCKED_IMPORTS = r"""
import importlib, importlib.abc, importlib.metadata, json, re, runpy, sys
allowed, programs = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])
owners = importlib.metadata.packages_distributions()

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        owned = owners.get(name.partition(".")[0], [])
        if owned and not any(re.sub(r"[-_.]+", "-", d).lower() in allowed for d in owned):
            raise ModuleNotFoundError(f"No module named {name!r} (from {', '.join(owned)})", name=name)

sys.meta_path.insert(0, NotInstalled())
failed = {}
for kind, program in programs:
    try:
        if kind == "module":
            importlib.import_module(program)
        else:
            sys.path.insert(0, program.rpartition("/")[0])
            runpy.run_path(program, run_name="__imported__")
    except Exception as error:
        failed[program] = f"{type(error).__name__}: {error}"
print(json.dumps(failed))
"""


def importable(programs: Iterable[tuple[str, str]], allowed: frozenset[str]) -> dict[str, str]:
    """Which programs fail to import with only `allowed` installed, and why."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS, json.dumps(sorted(allowed)), json.dumps(sorted(set(programs)))],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    failed: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return failed


def program_of(matched: re.Match[str]) -> tuple[str, str] | None:
    """("module", its importable name) or ("script", its path) for a program of the repository's."""
    if matched["script"]:
        return "script", matched["script"]
    module = matched["module"]
    folder = REPO_ROOT.joinpath(*module.split("."))
    if module == "pytest":  # the test runner, with the tests' own imports on top (tests/conftest.py)
        return "module", module
    if not (REPO_ROOT / module.split(".")[0]).is_dir():
        return None  # pip, venv: the interpreter's own
    return "module", f"{module}.__main__" if (folder / "__main__.py").is_file() else module


def test_every_target_installs_what_its_programs_import() -> None:
    runs: dict[tuple[str, ...] | None, dict[tuple[str, str], list[str]]] = {}
    text = (REPO_ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    for matched in RUN.finditer(text):  # $(PYTHON) anywhere, in a recipe or a $(shell ...)
        program = program_of(matched)
        if matched["python"] == "$(PYTHON)" and program is not None:
            runs.setdefault(None, {}).setdefault(program, []).append("$(PYTHON)")
    for target, rule in rules().items():
        for line in rule.recipe:
            for matched in RUN.finditer(line):
                program = program_of(matched)
                if matched["python"] == "$(BIN)/python" and program is not None:
                    runs.setdefault(installed_for(target), {}).setdefault(program, []).append(f"make {target}")
    assert any(programs for programs in runs.values()), "no program found in the Makefile"
    problems = []
    for extras, programs in runs.items():
        for name, why in importable(programs, distributions(extras)).items():
            where = ", ".join(sorted({w for (_, p), ws in programs.items() if p == name for w in ws}))
            installed = "nothing" if extras is None else f"onepass[{','.join(extras)}]" if extras else "onepass"
            problems.append(f"{where}: {name} fails with {installed} installed: {why}")
    assert not problems, "\n".join(problems)


def test_check_gpu_fetches_the_small_model_only_when_it_checks_it(tmp_path: Path) -> None:
    def planned(*args: str) -> str:  # make -n: the commands it would run, none run
        done = subprocess.run(
            ["make", "-n", "--no-print-directory", "check-gpu", f"VENV={tmp_path}", *args],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout

    assert "models/fetch.py small" in planned()
    given = planned("GPU_CHECK_MODEL=/elsewhere/mine.gguf")  # a GPU machine may have no network
    assert "models/fetch.py" not in given and "-m tools.check_gpu /elsewhere/mine.gguf" in given
