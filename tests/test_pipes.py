"""tests/support/pipes.py finds a marker that arrived in the same read as the line before it, and fails
plainly when the pipe ends without it (a real child process, a real pipe)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.pipes import read_until

# Both lines in one write, then the child waits for its stdin to close: the pipe stays open.
TWO_LINES_THEN_WAIT = (
    "import sys; sys.stdout.write('prefilled\\nready: serving\\n'); sys.stdout.flush(); sys.stdin.read()"
)


def child(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_a_marker_read_together_with_the_line_before_it_is_found() -> None:
    process = child(TWO_LINES_THEN_WAIT)
    try:
        assert process.stdout is not None
        # a readline() here would take both lines off the pipe and a select() then wait for ever
        assert read_until(process.stdout, "ready: serving", timeout=60) == "prefilled\nready: serving\n"
    finally:
        process.communicate(timeout=60)  # closes stdin: the child ends


def test_a_pipe_that_ends_without_the_marker_fails_the_test_at_once() -> None:
    process = child("print('loading failed')")
    try:
        assert process.stdout is not None
        with pytest.raises(pytest.fail.Exception, match="the pipe ended before 'ready: serving': loading failed"):
            read_until(process.stdout, "ready: serving", timeout=60)
    finally:
        process.communicate(timeout=60)
