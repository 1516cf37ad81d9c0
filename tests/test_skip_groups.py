"""The skip-group plugin (tests/support/skip_groups.py) on a small suite of its own, run in-process: the run's
last line names every group skipped and why, and under CI=true a skipped group the run did not leave to
another target fails it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from app.paths import REPO_ROOT
from tests.support.skip_groups import GROUPS, skip_if

SUITE = """
import pytest

from tests.support.skip_groups import skip, skip_if


@pytest.fixture(scope="module")
def haproxy():
    skip("fleet", "no haproxy")


def test_runs():
    pass


def test_fleet_one(haproxy):
    pass


def test_fleet_two(haproxy):
    pass


@skip_if(True, "gpu", "a CPU build")
def test_on_a_device():
    pass


@skip_if(False, "gpu", "a CPU build")
def test_where_the_condition_is_false():
    pass


@pytest.mark.xfail(reason="an expected failure is not a skip")
def test_expected_to_fail():
    raise AssertionError
"""
UNGROUPED = """
import pytest


def test_plain():
    pytest.skip("no reason given a group")
"""

FLEET = "fleet (2 tests: no haproxy)"
GPU = "gpu (1 test: a CPU build)"


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: bool, *args: str) -> pytest.RunResult:
    monkeypatch.setenv("CI", "true") if ci else monkeypatch.delenv("CI", raising=False)
    return pytester.runpytest("-p", "tests.support.skip_groups", "-q", *args)


def test_a_run_ends_with_one_line_naming_each_skipped_group_and_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = run(pytester, monkeypatch, False)
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=2, skipped=3, xfailed=1)
    assert result.outlines[-1] == f"skipped groups: {FLEET}, {GPU}"

    left = run(pytester, monkeypatch, False, "--may-skip=gpu")
    assert left.outlines[-1] == f"skipped groups: {FLEET}; left to other targets (--may-skip): {GPU}"


def test_under_ci_a_group_the_run_may_not_skip_fails_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_suite=SUITE)
    failed = run(pytester, monkeypatch, True, "--may-skip=gpu")
    assert failed.ret == pytest.ExitCode.TESTS_FAILED
    assert failed.outlines[-1] == (
        f"FAILED, CI=true and this run must run every group it skipped: {FLEET}; "
        f"left to other targets (--may-skip): {GPU}"
    )
    allowed = run(pytester, monkeypatch, True, "--may-skip=gpu, fleet")
    assert allowed.ret == pytest.ExitCode.OK
    assert allowed.outlines[-1] == f"skipped groups: left to other targets (--may-skip): {FLEET}, {GPU}"


def test_a_skip_without_a_group_is_named_by_its_place_and_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_plain=UNGROUPED)
    local = run(pytester, monkeypatch, False)
    assert local.ret == pytest.ExitCode.OK
    assert local.outlines[-1] == "skipped groups: no group (1 test: test_plain.py:5: no reason given a group)"
    assert run(pytester, monkeypatch, True).ret == pytest.ExitCode.TESTS_FAILED


def test_a_run_that_skips_nothing_says_so_and_unknown_groups_are_refused(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    assert run(pytester, monkeypatch, True).outlines[-1] == "skipped groups: none"
    refused = run(pytester, monkeypatch, False, "--may-skip=gpu,no-such-group")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    assert "--may-skip: no skip group no-such-group" in refused.stderr.str()
    with pytest.raises(ValueError, match="no skip group 'no-such-group'"):  # a misspelt group, at import
        skip_if(True, "no-such-group", "why")


# --- the repository's own skips -------------------------------------------------------------------

TESTS = REPO_ROOT / "tests"
OWN = {TESTS / "support" / "skip_groups.py", Path(__file__).resolve()}


def groups_named(tree: ast.AST) -> set[str]:
    """The groups that `skip(group, why)` and `skip_if(condition, group, why)` calls name."""
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("skip", "skip_if"):
            group = node.args[0 if node.func.id == "skip" else 1]
            assert isinstance(group, ast.Constant) and isinstance(group.value, str), ast.unparse(node)
            named.add(group.value)
    return named


def test_every_skip_in_the_suite_names_a_declared_group_and_every_group_is_used() -> None:
    bare = []
    named: set[str] = set()
    for path in sorted(TESTS.rglob("*.py")):
        if path in OWN:
            continue
        text = path.read_text(encoding="utf-8")
        bare += [f"{path.relative_to(REPO_ROOT)}: {m[0]}" for m in re.finditer(r"pytest\.(?:skip\(|mark\.skip)", text)]
        named |= groups_named(ast.parse(text))
    advice = "use tests/support/skip_groups.py's skip or skip_if"
    assert not bare, f"skips that name no group ({advice}):\n" + "\n".join(bare)
    assert named == GROUPS.keys(), f"named but not declared: {named - GROUPS.keys()}; unused: {GROUPS.keys() - named}"


def test_every_group_a_make_target_may_skip_is_declared() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    runs = re.findall(r"-m pytest\b[^\n]*", makefile.replace("\\\n", " "))
    assert runs and all("--may-skip=" in run for run in runs), "every pytest run in the Makefile says what it may skip"
    for run in runs:
        may_skip = re.search(r"--may-skip=(\S*)", run)
        assert may_skip is not None
        assert set(filter(None, may_skip[1].split(","))) <= GROUPS.keys(), run
