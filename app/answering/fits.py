"""Fitted calibrations kept as verified files: one folder per model file and prompt, one file per fit.

A fit is found by its question's content (type, instructions, criteria; canonical JSON, so the
order of a choice's options does not matter), never by the id a request gives the question. Files
are written whole (a temporary file renamed over) and carry a digest of their content; a file that
does not verify, or was fitted for another model or prompt, is skipped. Servers sharing the folder
share the fits: a server re-reads the folder when its modification time changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import blake3

from app.answering.fitting import Fit
from app.contract import Question, canonical_json

log = logging.getLogger("onepass.fits")
SUFFIX = ".fit.json"


def question_key(question: Question) -> str:
    """The content a fit is matched by: every field of the question, as canonical JSON."""
    return blake3.blake3(canonical_json(question.model_dump(mode="json")).encode()).hexdigest()[:32]


def _digest(fields: dict[str, Any]) -> str:
    return blake3.blake3(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class FitStore:
    """The fits of one model and prompt (`identity`), in `folder`."""

    def __init__(self, folder: Path, identity: str) -> None:
        self.folder = folder
        self.identity = identity
        self._lock = threading.Lock()
        self._seen: int | None = None  # the folder's mtime_ns when last read
        self._by_key: dict[str, dict[str, Any]] = {}
        self._sets: list[dict[str, Any]] = []

    def put(self, record: dict[str, Any]) -> dict[str, Any]:
        """Store a fit record (its `key`, `method`, `fit`, `examples`, ...); returns it with its id."""
        fields = {**record, "identity": self.identity}
        fields["id"] = blake3.blake3(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in self.records():  # one fit per question (or question set): the new one replaces it
            if old["key"] == fields["key"] and old.get("set") == fields.get("set"):
                self.delete(old["id"])
        target = self.folder / f"{fields['id']}{SUFFIX}"
        with tempfile.NamedTemporaryFile("w", dir=self.folder, suffix=".tmp", delete=False) as out:
            json.dump({**fields, "digest": _digest(fields)}, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(out.name, target)
        self._seen = None
        return fields

    def delete(self, fit_id: str) -> bool:
        path = self.folder / f"{fit_id}{SUFFIX}"
        if not fit_id.isalnum() or not path.is_file():
            return False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._seen = None
        return True

    def records(self) -> list[dict[str, Any]]:
        """Every sound fit in the folder, oldest first by id order."""
        found = []
        for path in sorted(self.folder.glob(f"*{SUFFIX}")) if self.folder.is_dir() else []:
            record = self._read(path)
            if record is not None:
                found.append(record)
        return found

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            fields = {k: v for k, v in data.items() if k != "digest"}
            if data["digest"] != _digest(fields) or fields["identity"] != self.identity:
                raise ValueError("digest or identity")
            fields["parsed"] = Fit.from_json(fields["fit"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("skipping fit file %s: %s", path, error)
            return None
        return fields

    def _refresh(self) -> None:
        try:
            stamp = self.folder.stat().st_mtime_ns
        except OSError:
            stamp = -1
        with self._lock:
            if stamp == self._seen:
                return
            records = self.records()
            self._by_key = {r["key"]: r for r in records if not r.get("set")}
            self._sets = [r for r in records if r.get("set")]
            self._seen = stamp

    def single(self, key: str) -> dict[str, Any] | None:
        """The fit for one question's content, if any."""
        self._refresh()
        return self._by_key.get(key)

    def for_set(self, keys: set[str]) -> list[dict[str, Any]]:
        """Question-set fits whose whole set is among `keys` (the request asks every question of it)."""
        self._refresh()
        return [r for r in self._sets if set(r["set"]) <= keys]
