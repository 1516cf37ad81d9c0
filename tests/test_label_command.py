"""`onepass label` as a user runs it: a server process on the tiny model with a labelling session,
killed with SIGKILL while labels are being posted, then started again: every label it acknowledged is in
the labels file, the file is whole, and the new session counts them and reuses the answered evidence."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from app.labelling.labels import LabelsFile, labels_path
from app.paths import REPO_ROOT
from tests.support.labelling_states import index_of, right, write_states

WAIT_S = 180.0


class LabelServer:
    """`onepass label STATES` in a process of its own; its URL is read from what it prints."""

    def __init__(self, states: Path, model: Path, fits: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPASS_")}
        flags = ["-m", str(model), "--port", "0", "-t", "1", "--repack", "off", "--flash-attn", "off"]
        flags += ["--session-cache-disk-bytes", "0", "--calibration-dir", str(fits)]
        command = [sys.executable, "-m", "app", "label", str(states), *flags]
        self.process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True)
        self.printed: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        first = self.printed.get(timeout=WAIT_S)
        self.labels_line = self.printed.get(timeout=WAIT_S)
        assert first.startswith(f"label the states of {states} at http://127.0.0.1:") and first.endswith("/#label")
        self.url = first.rsplit(" ", 1)[1].removesuffix("/#label")

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.printed.put(line.rstrip("\n"))

    def session(self) -> dict[str, Any]:
        reply: dict[str, Any] = httpx.get(self.url + "/v1/labelling", timeout=30).json()
        return reply

    def answered(self) -> dict[str, Any]:
        """The session once its states are answered (the server is asked until then, within WAIT_S)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                shown = self.session()
                if shown["answering"] is not None and shown["answering"]["status"] == "done":
                    return shown
            except (httpx.TransportError, KeyError):
                pass  # still loading the model: the session is not there yet
            assert time.monotonic() < deadline, "the states were not answered in time"
            threading.Event().wait(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(60)


def test_a_server_flag_before_the_states_file_is_named_as_the_mistake(tmp_path: Path) -> None:
    states = write_states(tmp_path / "states.jsonl", 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEPASS_")}
    command = [sys.executable, "-m", "app", "label", "--port", "8081", str(states)]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert "8081 is not a states file: the states file comes first, then the flags" in result.stderr


@pytest.fixture
def states(tmp_path: Path) -> Path:
    return write_states(tmp_path / "states.jsonl", 24, labelled=4)


@pytest.fixture
def first(states: Path, tiny_chat_path: Path, tmp_path: Path) -> Iterator[LabelServer]:
    server = LabelServer(states, tiny_chat_path, tmp_path / "fits")
    try:
        yield server
    finally:
        server.stop()


def test_a_kill_9_loses_no_acknowledged_label(
    first: LabelServer, states: Path, tiny_chat_path: Path, tmp_path: Path
) -> None:
    assert first.labels_line == f"labels are kept in {labels_path(states)}"
    shown = first.answered()
    assert shown["labelled"] == 4 and shown["answering"]["reused"] == 0
    offered = [s["state"] for s in httpx.get(first.url + "/v1/labelling/next?count=20", timeout=30).json()["states"]]
    acknowledged: list[int] = []
    five = threading.Event()

    def label() -> None:
        with httpx.Client(timeout=30) as client:
            for line in offered:
                try:
                    reply = client.post(
                        first.url + "/v1/labelling/labels", json={"state": line, "answers": right(index_of(line))}
                    )
                except httpx.TransportError:
                    return  # killed
                assert reply.status_code == 200, reply.text
                acknowledged.append(line)
                if len(acknowledged) == 5:
                    five.set()

    poster = threading.Thread(target=label)
    poster.start()
    assert five.wait(WAIT_S), "five labels were not acknowledged in time"
    first.process.kill()  # SIGKILL, while the next label is on its way
    first.process.wait(30)
    poster.join(60)
    assert len(acknowledged) >= 5

    kept = LabelsFile(labels_path(states))
    assert not kept.warnings  # every line whole and verified
    assert set(acknowledged) <= set(kept.lines())
    again = LabelServer(states, tiny_chat_path, tmp_path / "fits")
    try:
        shown = again.answered()
        assert shown["labelled"] == 4 + len(kept.lines()) and shown["answering"]["reused"] == 24
        offered_now = httpx.get(again.url + "/v1/labelling/next?count=20", timeout=30).json()["states"]
        assert not {s["state"] for s in offered_now} & set(kept.lines())
        # the answers the journal kept are whole: their share on the labels too
        assert all("x_label_mass" in a for s in offered_now for a in s["answers"].values())
    finally:
        again.stop()
