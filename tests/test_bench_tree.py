"""bench/ holds what is run and what is cited: every module is run by a make target, used by a test or
given as a command by a user page (or imported by one that is), and every report in bench/results is
cited by a page, a dated note, bench/README.md or a test. A finished study leaves the tree, its
conclusions kept in a dated note in docs/notes/ that names the commit that still has it."""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
from pathlib import Path

from app.paths import REPO_ROOT
from tests.support.imports import bench_imports
from tests.support.pages import makefile_rules

BENCH = REPO_ROOT / "bench"
RESULTS = BENCH / "results"
# The user pages: the README and docs/, not the dated notes (a note may name a command run once).
USER_PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
TESTS = sorted(p for p in (REPO_ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve())
# What may cite a report: every page and note, bench/README.md and the tests (less this file).
CITING = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md")), BENCH / "README.md", *TESTS]

# Finished studies that a change on its way deletes (module: why): drop each entry once its module is gone.
LEAVING: dict[str, str] = {}

RUN = re.compile(r"-m\s+bench\.(\w+)")  # python -m bench.X in a recipe
PAGE_RUN = re.compile(r"python3?\s+-m\s+bench\.(\w+)")  # a command a page gives, maybe over two lines
CITED = re.compile(r"bench/results/([\w.*?{},\[\]<>-]+)")
REPORT = re.compile(r"\.(?:json|md|png)$")  # one run writes its report as .json, .md and .png


def modules() -> set[str]:
    return {path.stem for path in BENCH.glob("*.py") if path.stem != "__init__"}


def run_by(test: Path) -> set[str]:
    """The bench modules a test runs as a program: a string "bench.X" alone (`[python, "-m", "bench.X"]`)."""
    tree = ast.parse(test.read_text(encoding="utf-8"))
    return {
        node.value.removeprefix("bench.")
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"bench\.\w+", node.value)
    }


def why_kept() -> dict[str, str]:
    """Each bench module that something runs or names, and the first thing found that does."""
    found: dict[str, str] = {}
    for target, recipe in makefile_rules().items():
        for module in RUN.findall(" ".join(recipe)):
            found.setdefault(module, f"make {target}")
    for test in TESTS:
        for module in bench_imports(test) | run_by(test):
            found.setdefault(module, str(test.relative_to(REPO_ROOT)))
    for page in USER_PAGES:
        for module in PAGE_RUN.findall(page.read_text(encoding="utf-8")):
            found.setdefault(module, f"{page.relative_to(REPO_ROOT)} gives `python -m bench.{module}`")
    imported = list(found)
    while imported:  # what a kept module imports stays with it
        module = imported.pop()
        for dependency in bench_imports(BENCH / f"{module}.py") - found.keys():
            found[dependency] = f"imported by bench/{module}.py"
            imported.append(dependency)
    return found


def test_every_bench_module_is_run_by_a_target_a_test_or_a_user_page() -> None:
    kept = why_kept()
    stray = sorted(modules() - kept.keys() - LEAVING.keys())
    assert not stray, (
        f"bench modules nothing runs: {stray}. Run each from a make target or a test, give it in a user page, "
        "or delete it and keep its conclusions in a dated note in docs/notes/ naming the last commit that has it"
    )
    assert LEAVING.keys() <= modules(), (
        f"LEAVING names modules that are gone: drop {sorted(LEAVING.keys() - modules())}"
    )


def alternatives(pattern: str) -> list[str]:
    """A glob's brace alternatives, expanded: `x{,-y}.{json,md}` is four patterns."""
    braces = re.search(r"\{([^{}]*)\}", pattern)
    if braces is None:
        return [pattern]
    return [
        expanded
        for alternative in braces[1].split(",")
        for expanded in alternatives(pattern[: braces.start()] + alternative + pattern[braces.end() :])
    ]


def citations() -> dict[str, str]:
    """Each path or glob under bench/results that a page, note or test cites (less placeholders such as
    `<date>`, which stand for any run), and where."""
    found: dict[str, str] = {}
    for source in CITING:
        text = source.read_text(encoding="utf-8")
        for cited in CITED.finditer(text):
            if "<" not in cited[1]:
                where = f"{source.relative_to(REPO_ROOT)}:{text.count(chr(10), 0, cited.start()) + 1}"
                found.setdefault(cited[1].rstrip(".,:;"), where)
    return found


def result_files() -> list[str]:
    """The files of bench/results that the repository keeps: what git ignores (a run's large side files,
    such as the evidence's hidden states) is this machine's, not the tree's."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", str(RESULTS)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    return sorted(Path(line).name for line in listed if (REPO_ROOT / line).is_file())


def test_every_report_in_bench_results_is_cited_and_every_citation_finds_one() -> None:
    files = result_files()
    runs: set[str] = set()
    unmatched = []
    for cited, where in citations().items():
        matched = [name for pattern in alternatives(cited) for name in fnmatch.filter(files, pattern)]
        runs |= {REPORT.sub("", name) for name in matched}
        if not matched:
            unmatched.append(f"{where}: bench/results/{cited}")
    uncited = [name for name in files if REPORT.sub("", name) not in runs]
    assert not uncited, (
        f"{len(uncited)} files in bench/results that nothing cites (a run's .json, .md and .png count as one): "
        f"{uncited}. Cite each where its figures are used, or delete it and keep what it found in a dated note"
    )
    assert not unmatched, "citations of bench/results that match no file:\n" + "\n".join(unmatched)


def test_the_bench_readme_names_every_scenario_and_the_target_that_runs_it() -> None:
    readme = (BENCH / "README.md").read_text(encoding="utf-8")
    scenarios = [
        m for m in sorted(modules() - LEAVING.keys()) if '__name__ == "__main__"' in (BENCH / f"{m}.py").read_text()
    ]
    missing = [f"bench/{m}.py" for m in scenarios if f"bench/{m}.py" not in readme and f"bench.{m}" not in readme]
    missing += [f"make {t}" for t, recipe in makefile_rules().items() if RUN.search(" ".join(recipe))]
    missing = [name for name in missing if name.startswith("bench/") or f"`{name}`" not in readme]
    assert not missing, f"bench/README.md does not say what these are: {missing}"
