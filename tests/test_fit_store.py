"""FitStore.put replaces a question's fit: the new file is written before the old one is deleted, under the
store's lock, so a reader always finds a fit for the question, two puts at once leave one, and a write that
fails keeps the old fit and leaves no temporary file."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from app.calibration import Fit, FitRecord
from app.calibration.store import SUFFIX, FitStore

JOIN_S = 60.0  # for the threads of a test: far beyond what they need


def fit_for(key: str, scale: float) -> FitRecord:
    """A fit of question `key`; each `scale` makes another fit (another id) for the same question."""
    return FitRecord(key, {"type": "boolean"}, "vector/0.1", Fit("vector", ("true", "false"), scale=scale), 10)


def fit_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(SUFFIX))


def run_all(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
        assert not thread.is_alive()


def test_a_put_replaces_the_fit_of_its_question_and_keeps_the_others(tmp_path: Path) -> None:
    store = FitStore(tmp_path, "model")
    store.put(fit_for("q", 1.0))
    other = store.put(fit_for("other", 1.0))
    newer = store.put(fit_for("q", 2.0))
    assert store.single("q") == newer
    assert store.single("other") == other
    assert fit_files(tmp_path) == sorted(f"{fit.id}{SUFFIX}" for fit in (newer, other))


def test_putting_the_same_fit_again_keeps_it(tmp_path: Path) -> None:
    store = FitStore(tmp_path, "model")
    first = store.put(fit_for("q", 1.0))
    assert store.put(fit_for("q", 1.0)) == first  # the same content, the same id: the file is rewritten, not lost
    assert fit_files(tmp_path) == [f"{first.id}{SUFFIX}"]


def test_concurrent_puts_for_one_question_leave_exactly_one_fit(tmp_path: Path) -> None:
    store = FitStore(tmp_path, "model")
    threads_n, rounds = 8, 40
    left: list[int] = []  # the fit files of the question after each round of puts at once
    each_round = threading.Barrier(threads_n, action=lambda: left.append(len(fit_files(tmp_path))), timeout=JOIN_S)

    def puts(thread: int) -> None:
        for n in range(rounds):
            each_round.wait()  # every thread puts at the same moment
            store.put(fit_for("q", 1.0 + thread + threads_n * n))
        each_round.wait()

    run_all([threading.Thread(target=puts, args=(t,)) for t in range(threads_n)])
    assert left[1:] == [1] * rounds
    assert [r.key for r in FitStore(tmp_path, "model").records()] == ["q"]


@pytest.mark.parametrize("reader", ["the same store", "another server's store on the folder"])
def test_a_reader_never_finds_the_question_without_a_fit_while_it_is_replaced(tmp_path: Path, reader: str) -> None:
    store = FitStore(tmp_path, "model")
    store.put(fit_for("q", 1.0))
    polling = store if reader == "the same store" else FitStore(tmp_path, "model")
    replaced = threading.Event()
    polls, missing = 0, 0

    def replace() -> None:
        try:
            for n in range(200):
                store.put(fit_for("q", 2.0 + n))
        finally:
            replaced.set()

    def poll() -> None:
        nonlocal polls, missing
        while not replaced.is_set():
            polls += 1
            missing += polling.single("q") is None

    run_all([threading.Thread(target=replace), threading.Thread(target=poll)])
    assert polls > 200  # the reader ran all along the replaces
    assert missing == 0


def test_a_write_that_fails_keeps_the_old_fit_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FitStore(tmp_path, "model")
    old = store.put(fit_for("q", 1.0))

    def full_disk(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")  # where a full disk shows with delayed allocation

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        store.put(fit_for("q", 2.0))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{old.id}{SUFFIX}"]
    assert store.single("q") == old
    assert FitStore(tmp_path, "model").single("q") == old
