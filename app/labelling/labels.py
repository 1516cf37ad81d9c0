"""The user's labels for a states file, kept as a verified file beside it: `S.labels.jsonl` for `S.jsonl`.

Each line is an example as `onepass calibrate` reads it (state, questions, the state's image fields,
answers, and `x_drawn`: whether the state was offered at random, app/labelling/ranking.py), plus
`x_state` (the line of the state in S.jsonl, from 1) and `x_digest` (blake3 of the line's canonical
JSON without it). A line keeps the order of the states file's questions and options.

A label is on disk before `put` returns, so one once acknowledged survives a kill -9. A state's first
label is appended as one line and the file synced (its folder too when this creates the file): a
label costs its own line, not the file, whose lines repeat their states' images. A crash mid-append
leaves at most a torn last line, which reading skips with a warning. Any other change rewrites the
whole file atomically (a temporary file renamed over it), in the states' order: a relabel, since `onepass
calibrate` reads every line as an example and must not meet a state's superseded label, and the
first label after reading found a damaged line or a state's line twice (the later one wins), so that
the file again holds each state once and an append never lands on a torn line. Reading checks each
line's digest: a damaged line is skipped with a warning naming it, and the file as it was is kept
beside it (`FILE.damaged`) before the next rewrite leaves that line out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import blake3

from app.paths import fsync_folder, write_atomically
from app.wire.contract import canonical_json

log = logging.getLogger("onepass.labels")
STATE_KEY, DIGEST_KEY = "x_state", "x_digest"


def labels_path(states: Path) -> Path:
    """Where the labels of `states` are kept by default: S.labels.jsonl beside S.jsonl."""
    return states.with_name(states.name.removesuffix(".jsonl") + ".labels.jsonl")


def digest_of(line: Mapping[str, Any]) -> str:
    fields = {k: v for k, v in line.items() if k != DIGEST_KEY}
    return blake3.blake3(canonical_json(fields).encode()).hexdigest()


def as_given(line: Mapping[str, Any]) -> str:
    """The line as one line of JSON in its own order, not sorted: the order of the questions and of a
    choice's options shapes the prompt, so `onepass calibrate` must read them as the states file has them."""
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sealed(line: Mapping[str, Any]) -> dict[str, Any]:
    """The line with its digest."""
    fields = {k: v for k, v in line.items() if k != DIGEST_KEY}
    return {**fields, DIGEST_KEY: digest_of(fields)}


class LabelsFile:
    """The labels of one states file, by state (its line in the states file). Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.warnings: list[str] = []  # what reading it found wrong, a line each
        self._lock = threading.Lock()
        self._rewrite = False  # whether the next put rewrites the file rather than append to it
        self._lines: dict[int, dict[str, Any]] = self._read()

    def _read(self) -> dict[int, dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        found: dict[int, dict[str, Any]] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            why = self._fault(raw)
            if why is not None:
                self._warn(f"{self.path}: line {n} skipped: {why}")
                continue
            line = json.loads(raw)
            self._rewrite |= line[STATE_KEY] in found
            found[line[STATE_KEY]] = line  # a later line for the same state replaces an earlier one
        # damaged lines are left out, and an append must not land on the end of an unfinished line
        self._rewrite |= bool(self.warnings) or (text != "" and not text.endswith("\n"))
        if self.warnings:  # the next rewrite leaves the damaged lines out: keep the file as it was
            shutil.copyfile(self.path, self.path.with_name(self.path.name + ".damaged"))
            self._warn(f"{self.path}: kept as it was in {self.path.name}.damaged")
        return found

    @staticmethod
    def _fault(raw: str) -> str | None:
        try:
            line = json.loads(raw)
        except ValueError as error:
            return f"not JSON ({error})"
        if not isinstance(line, dict) or not isinstance(line.get(DIGEST_KEY), str):
            return "not a labelled example with its digest"
        if line[DIGEST_KEY] != digest_of(line):
            return "its digest does not match (damaged, or edited by hand)"
        state = line.get(STATE_KEY)
        if isinstance(state, bool) or not isinstance(state, int) or state < 1:
            return f"{STATE_KEY} is not a line number"
        return None

    def _warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)

    def lines(self) -> dict[int, dict[str, Any]]:
        """Each labelled state's line, by its line in the states file."""
        with self._lock:
            return dict(self._lines)

    def put(self, state: int, example: Mapping[str, Any]) -> dict[str, Any]:
        """Store the labels of `state` (an example: state, questions, images, answers), replacing any it
        had; returns the line as written. On return the line is on disk."""
        line = sealed({**{k: v for k, v in example.items() if k not in (STATE_KEY, DIGEST_KEY)}, STATE_KEY: state})
        with self._lock:
            lines = {**self._lines, state: line}
            if self._rewrite or state in self._lines:
                self._write(lines)
                self._rewrite = False
            else:
                try:
                    self._append(line)
                except BaseException:
                    self._rewrite = True  # the file may hold part of the line, or all of it unacknowledged
                    raise
            self._lines = lines
        return line

    def _append(self, line: Mapping[str, Any]) -> None:
        """The line at the end of the file, synced; on a failure the file is cut back to its old end."""
        data = memoryview((as_given(line) + "\n").encode())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:  # O_EXCL tells whether this call made the file: only then is there a folder entry to sync
            descriptor, created = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600), True
        except FileExistsError:
            descriptor, created = os.open(self.path, os.O_WRONLY | os.O_APPEND), False
        try:
            end = os.fstat(descriptor).st_size
            try:
                while data:
                    data = data[os.write(descriptor, data) :]
                os.fsync(descriptor)
            except BaseException:
                with contextlib.suppress(OSError):  # what no one acknowledged must not be read back
                    os.ftruncate(descriptor, end)
                raise
        finally:
            os.close(descriptor)
        if created:
            fsync_folder(self.path.parent)

    def _write(self, lines: Mapping[int, Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, ((as_given(lines[n]) + "\n").encode() for n in sorted(lines)))
