"""Reading a child process's pipe up to a marker, with a deadline.

select() watches the pipe's file descriptor, not a Python file object's buffer: a readline() that
took two lines off the pipe returns the first and keeps the second in its buffer, where select()
never sees it, and a wait for that second line times out with the line already read (CI lost a
run so: "ready: serving" came in the same read as the line before it). So this reads the
descriptor itself and keeps what it read.
"""

from __future__ import annotations

import codecs
import os
import selectors
import time
from typing import IO

import pytest


def read_until(stream: IO[str] | IO[bytes], marker: str, timeout: float) -> str:
    """Everything `stream` gives up to and including the chunk holding `marker`; fails the test after
    `timeout` seconds, or when the pipe ends first. Read `stream` only through this until then."""
    descriptor = stream.fileno()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = ""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(descriptor, selectors.EVENT_READ)
        while marker not in text:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                pytest.fail(f"no {marker!r} within {timeout} s: {text}")
            chunk = os.read(descriptor, 1 << 16)
            if not chunk:
                pytest.fail(f"the pipe ended before {marker!r}: {text}")
            text += decoder.decode(chunk)
    return text
