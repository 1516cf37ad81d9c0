"""Skips by group: a test that cannot run here says which group of tests it belongs to and why, every
run ends with one line naming each group it skipped, and under CI=true a skipped group fails the run
unless the run left that group to another make target.

A test skips with `skip(group, why)` or the mark `skip_if(condition, group, why)`. A run names the groups
it leaves to other targets with `--may-skip=a,b` (the Makefile's test targets do, each for its own
suite). A skip that names no group is reported as such, and under CI=true always fails the run.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import NoReturn

import pytest

# Each group: the tests it holds. The reasons a group skips are each skip's own.
GROUPS: dict[str, str] = {
    "real-model": "the tests on the real default model",
    "native-server": "onepass against llama.cpp's own /v1/systemone",
    "native-template": "decision templates against llama.cpp's own template engine",
    "gpu": "every layer on a GPU device",
    "build-choice": "a chosen Vulkan build kept by make run, check-gpu and test-gpu",
    "cpu-build": "what only a build without a GPU backend does",
    "not-cuda": "what the CPU's and Vulkan's kernels keep and CUDA's do not",
    "tmpfs": "the disk tier on a full or read-only disk",
    "emulated-cpu": "the build on an emulated AVX2-only EPYC",
    "emulated-cpu-inconclusive": "the emulated EPYC, where the build adds nothing a tiny decode is sure to run",
    "fleet": "replicas behind HAProxy",
    "browser": "the page in headless Chromium",
    "install": "the package installed into a fresh venv",
    "checkout-venv": "a server started from another checkout",
    "linux": "Linux's CPU topology files",
}

TAG = re.compile(r"(?:Skipped: )?\[(?P<group>[\w-]+)\] (?P<why>.*)", re.DOTALL)
UNGROUPED = "no group"


def tagged(group: str, why: str) -> str:
    """A skip reason that names its group (what the report's reason carries)."""
    if group not in GROUPS:
        raise ValueError(f"no skip group {group!r}: declare it in tests/support/skip_groups.py")
    return f"[{group}] {why}"


def skip(group: str, why: str) -> NoReturn:
    """Skip the running test or fixture as one of `group`'s."""
    pytest.skip(tagged(group, why))


def skip_if(condition: bool, group: str, why: str) -> pytest.MarkDecorator:
    """A skipif mark whose skip counts toward `group`."""
    return pytest.mark.skipif(condition, reason=tagged(group, why))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


@dataclasses.dataclass
class Skipped:
    """One group's skips in this run: how many tests, and each distinct reason in the order seen."""

    tests: int = 0
    reasons: list[str] = dataclasses.field(default_factory=list)

    def add(self, why: str) -> None:
        self.tests += 1
        if why not in self.reasons:
            self.reasons.append(why)

    def text(self, group: str) -> str:
        count = f"{self.tests} test{'s' if self.tests != 1 else ''}"
        return f"{group} ({count}: {'; '.join(self.reasons)})"


class Ledger:
    """The run's skips by group (a plugin of this run's, registered by pytest_configure)."""

    def __init__(self, may_skip: frozenset[str]) -> None:
        self.may_skip = may_skip
        self.skipped: dict[str, Skipped] = {}
        self.line: str | None = None  # the run's last line, once the session has finished
        self.failed = False

    def record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        where, message = "", str(report.longrepr)
        if isinstance(report.longrepr, tuple):
            path, lineno, message = report.longrepr
            where = f"{os.path.relpath(path)}:{lineno}: "
        found = TAG.fullmatch(message)
        if found is None:
            self.skipped.setdefault(UNGROUPED, Skipped()).add(where + message.removeprefix("Skipped: "))
        else:
            self.skipped.setdefault(found["group"], Skipped()).add(found["why"])

    def finish(self, ci: bool) -> None:
        """The run's last line; under CI a skipped group that this run may not skip fails the run."""
        missed = [s.text(g) for g, s in self.skipped.items() if g not in self.may_skip]
        left = [s.text(g) for g, s in self.skipped.items() if g in self.may_skip]
        parts = [", ".join(missed)] if missed else []
        if left:
            parts.append("left to other targets (--may-skip): " + ", ".join(left))
        self.failed = ci and bool(missed)
        if self.failed:
            self.line = "FAILED, CI=true and this run must run every group it skipped: " + "; ".join(parts)
        else:
            self.line = "skipped groups: " + ("; ".join(parts) or "none")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is reported as skipped too
            self.record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.record(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
            return  # interrupted, or a usage or internal error: no verdict on skips
        self.finish(in_ci())
        if self.failed:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """The line goes last: pytest prints its own counts at the end of pytest_sessionfinish."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if self.line is not None and reporter is not None:
            reporter.write_line(self.line, red=self.failed, yellow=not self.failed and bool(self.skipped))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--may-skip",
        default="",
        help="comma-separated skip groups (tests/support/skip_groups.py) this run leaves to other targets: "
        "under CI=true a skip of any other group fails the run",
    )


def pytest_configure(config: pytest.Config) -> None:
    named = {g.strip() for g in str(config.getoption("--may-skip")).split(",") if g.strip()}
    unknown = sorted(named - GROUPS.keys())
    if unknown:
        named_here = "tests/support/skip_groups.py names them"
        raise pytest.UsageError(f"--may-skip: no skip group {', '.join(unknown)} ({named_here})")
    config.pluginmanager.register(Ledger(frozenset(named)), "skip-groups")
