"""What labelling costs as labels pile up, measured: a label appends its own line to the labels file
(bytes written, syncs, the file's inode), a crash mid-append or a line given twice is read back as the
latest whole lines, and the page's once-a-second poll of the session serializes none of the states'
images, however many are labelled."""

from __future__ import annotations

import base64
import io
import json
import os
import stat
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from app.answering.service import ModelService
from app.http.labelling import _overview
from app.jobs import JobRegistry
from app.labelling.labels import LabelsFile, as_given, labels_path, sealed
from app.labelling.session import LabellingSession, read_states
from tests.support.labelling_states import QUESTIONS, right, state
from tests.support.skip_groups import skip_if

THREAD_IO = Path("/proc/thread-self/io")


def noise_png(side: int, seed: int) -> bytes:
    """A PNG stored uncompressed: its base64 takes about 4 bytes a pixel."""
    pixels = bytes((seed * 7919 + i * 104729) % 251 for i in range(side * side * 3))
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(out, format="PNG", compress_level=0)
    return out.getvalue()


def image_state(i: int, side: int = 96) -> dict[str, Any]:
    data = base64.b64encode(noise_png(side, i)).decode()
    asset = {"type": "image", "format": "png", "data_base64": data}
    return {"state": f"Ticket {i}, its photo: <photo>", "questions": QUESTIONS, "assets": {"photo": asset}}


def written_by_this_thread() -> int:
    """Bytes this thread has handed to write(2) so far (the kernel's count)."""
    fields = dict(line.split(": ") for line in THREAD_IO.read_text().splitlines())
    return int(fields["wchar"])


def whole_lines(path: Path) -> list[int]:
    return [json.loads(line)["x_state"] for line in path.read_text().splitlines()]


# --- the labels file ------------------------------------------------------------------------------


@skip_if(not THREAD_IO.is_file(), "linux", "needs Linux's per-thread I/O counts")
def test_a_label_writes_its_own_line_not_the_file_and_syncs_the_folder_only_as_it_makes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.labels.jsonl"
    labels = LabelsFile(path)
    synced: list[str] = []
    fsync = os.fsync

    def recording(descriptor: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(descriptor).st_mode) else "file")
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recording)
    labels.put(1, {**image_state(1), "answers": right(1)})
    assert synced == ["file", "folder"]  # the new file's entry in its folder must survive a power cut too
    for n in range(2, 20):
        labels.put(n, {**image_state(n), "answers": right(n)})
    before, synced[:] = path.stat(), []
    start = written_by_this_thread()
    line = labels.put(20, {**image_state(20), "answers": right(20)})
    written = written_by_this_thread() - start
    size = len((as_given(line) + "\n").encode())
    assert 10 * size < before.st_size  # the file holds nineteen lines about as long as this one
    assert size <= written < 2 * size  # this line's bytes, not the file's
    after = path.stat()
    assert after.st_ino == before.st_ino and after.st_size == before.st_size + size  # appended, not replaced
    assert synced == ["file"]
    assert whole_lines(path) == list(range(1, 21)) and set(LabelsFile(path).lines()) == set(range(1, 21))


def test_a_torn_last_line_is_skipped_with_a_warning_and_the_next_label_lands_whole(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    labels = LabelsFile(path)
    for n in (1, 2, 3):
        labels.put(n, {**state(n), "answers": right(n)})
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - len(whole.splitlines()[-1]) // 2])  # killed while appending line 3
    again = LabelsFile(path)
    assert set(again.lines()) == {1, 2}
    assert any("line 3 skipped: not JSON" in w for w in again.warnings)
    again.put(4, {**state(4), "answers": right(4)})  # not glued onto the torn line's end
    assert whole_lines(path) == [1, 2, 4]
    again.put(5, {**state(5), "answers": right(5)})
    read = LabelsFile(path)
    assert set(read.lines()) == {1, 2, 4, 5} and not read.warnings


def test_a_line_whose_append_failed_and_stayed_in_the_file_is_gone_after_the_next_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "labels.jsonl"
    labels = LabelsFile(path)
    labels.put(1, {**state(1), "answers": right(1)})

    def failing(descriptor: int, *args: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    monkeypatch.setattr(os, "ftruncate", failing)
    with pytest.raises(OSError, match="Input/output"):
        labels.put(2, {**state(2), "answers": right(2)})
    monkeypatch.undo()
    assert whole_lines(path) == [1, 2]  # written, never acknowledged
    labels.put(3, {**state(3), "answers": right(3)})
    assert whole_lines(path) == [1, 3] and set(labels.lines()) == {1, 3}


def test_a_state_s_latest_line_wins_and_the_next_label_leaves_each_state_once(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    labels = LabelsFile(path)
    labels.put(1, {**state(1), "answers": {"team": "Alpha"}})
    labels.put(2, {**state(2), "answers": right(2)})
    later = sealed({**state(1), "answers": {"team": "Gamma"}, "x_state": 1})  # a second line for state 1
    path.write_text(path.read_text() + as_given(later) + "\n")
    again = LabelsFile(path)
    assert again.lines()[1]["answers"] == {"team": "Gamma"} and not again.warnings
    again.put(3, {**state(3), "answers": right(3)})
    assert whole_lines(path) == [1, 2, 3]  # what onepass calibrate reads: each state's label once
    assert LabelsFile(path).lines() == again.lines()


# --- the session's poll ---------------------------------------------------------------------------


def no_model() -> AbstractContextManager[ModelService]:
    raise AssertionError("the overview and the labels need no model")


@pytest.fixture
def image_session(tmp_path: Path) -> Iterator[tuple[LabellingSession, int]]:
    """A session over 30 image states, 24 of them labelled in its labels file; and one image's length in
    base64."""
    items = [image_state(i) for i in range(30)]
    states = tmp_path / "states.jsonl"
    states.write_text("".join(json.dumps(item) + "\n" for item in items))
    session = LabellingSession(read_states(states), LabelsFile(labels_path(states)), "m", no_model, JobRegistry("t"))
    for i in range(24):
        session.label(i + 1, right(i))
    yield session, len(items[0]["assets"]["photo"]["data_base64"])


def test_a_poll_of_the_session_serializes_none_of_the_labelled_states_images(
    image_session: tuple[LabellingSession, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    session, image = image_session
    serialized: list[int] = []
    dumps = json.dumps

    def counting(value: Any, *args: Any, **kwargs: Any) -> str:
        text = dumps(value, *args, **kwargs)
        serialized.append(len(text))
        return text

    monkeypatch.setattr(json, "dumps", counting)
    polls = [_overview(session) for _ in range(5)]
    monkeypatch.undo()
    assert [p["labelled"] for p in polls] == [24] * 5 and polls[0]["states"] == 30
    assert sum(serialized) < image  # not one image, let alone 24 of them a poll


def test_a_label_is_counted_at_once_and_a_new_session_reads_the_same_labels(
    image_session: tuple[LabellingSession, int],
) -> None:
    session, _ = image_session
    session.label(30, right(29))
    assert len(session.labelled()) == 25 and session.labelled()[30].answers == {"team": 0, "urgent": 1}
    again = LabellingSession(session.states, LabelsFile(session.labels.path), "m", no_model, JobRegistry("t"))
    assert again.labelled() == session.labelled() and not again.warnings
