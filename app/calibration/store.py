"""Fits kept as verified files: one folder per model file, one file per fit, each fit marked with the
prompt it was fitted under (its identity).

A fit is found by its question's content (type, instructions, criteria; canonical JSON, so the
order of a choice's options does not matter), never by the id a request gives the question. Files
are written whole (a temporary file renamed over) and carry a digest of their content; a file that
does not verify, or was fitted for another model or prompt, is skipped. Servers sharing the folder
share the fits: a server reads the folder again when its modification time changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import blake3

from app.calibration.fit import FitRecord
from app.paths import write_atomically
from app.wire.contract import Question, canonical_json

log = logging.getLogger("onepass.fits")
SUFFIX = ".fit.json"
# A store opened with this identity lists and deletes the fits of every prompt in its folder: what can be
# known of a model not loaded, whose prompt is not known yet. Never an identity a fit is written with.
ANY_PROMPT = "*"
# Readings of the folder while files vanish from it (replaced by other puts) before one is taken as it is.
READS_WHILE_REPLACED = 3


def question_key(question: Question) -> str:
    """The content a fit is matched by: every field of the question, as canonical JSON."""
    return blake3.blake3(canonical_json(question.model_dump(mode="json")).encode()).hexdigest()[:32]


def _digest(fields: dict[str, Any]) -> str:
    return blake3.blake3(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class FitStore:
    """The fits of one model file and prompt (`identity`), in the model file's `folder`: a file there
    marked with another identity (the same model file in the other layout) is passed over."""

    def __init__(self, folder: Path, identity: str) -> None:
        self.folder = folder
        self.identity = identity
        self._lock = threading.Lock()
        self._seen: int | None = None  # the folder's mtime_ns when last read
        self._by_key: dict[str, FitRecord] = {}
        self._sets: list[FitRecord] = []

    def put(self, record: FitRecord) -> FitRecord:
        """Store a fit; returns it with its id and identity. It replaces the fit of the same question
        (or question set)."""
        fields = replace(record, id="", identity=self.identity).to_json()
        fit_id = blake3.blake3(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        stored = replace(record, id=fit_id, identity=self.identity)
        fields = stored.to_json()
        text = json.dumps({**fields, "digest": _digest(fields)}, sort_keys=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        # The new file first, then the ones it replaces: a reader always finds a fit for the question.
        # Under the lock, so that of two puts for one question the later deletes the earlier. Only the
        # files seen before writing are deleted: another server's put at the same moment can then leave
        # two (a reader takes the one whose id sorts last, the next put deletes both), never none.
        with self._lock:
            replaced = [
                old.id
                for old in self.records()
                if old.key == stored.key and old.question_set == stored.question_set and old.id != fit_id
            ]
            write_atomically(self.folder / f"{fit_id}{SUFFIX}", [text.encode()])
            for old_id in replaced:
                self.delete(old_id)
            self._seen = None
        return stored

    def delete(self, fit_id: str) -> bool:
        path = self.folder / f"{fit_id}{SUFFIX}"
        if not fit_id.isalnum() or not path.is_file():
            return False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._seen = None
        return True

    def forget(self, key: str) -> bool:
        """Delete the fit of one question's content (not a question-set fit); whether there was one."""
        record = self.single(key)  # the folder's index, read again only when the folder changed
        return record is not None and self.delete(record.id)

    def records(self) -> list[FitRecord]:
        """Every sound fit in the folder, in the order of their ids. A file deleted while the folder is
        read was replaced first (put writes before it deletes), so the folder is read again to find the
        file that replaced it."""
        for _ in range(READS_WHILE_REPLACED):
            found, vanished = [], False
            for path in sorted(self.folder.glob(f"*{SUFFIX}")) if self.folder.is_dir() else []:
                try:
                    record = self._read(path)
                except FileNotFoundError:
                    vanished = True
                    continue
                if record is not None:
                    found.append(record)
            if not vanished:
                break
        return found

    def _read(self, path: Path) -> FitRecord | None:
        """The fit in `path`, None if it is not sound; FileNotFoundError if it is gone."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            fields = {k: v for k, v in data.items() if k != "digest"}
            if data["digest"] != _digest(fields):
                raise ValueError("its digest does not match")
            if self.identity not in (ANY_PROMPT, fields["identity"]):  # another prompt of this model file
                log.debug("fit file %s is for another prompt", path)
                return None
            return FitRecord.from_json(fields)
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("skipping fit file %s: %s", path, error)
            return None

    def _refresh(self) -> None:
        try:
            stamp = self.folder.stat().st_mtime_ns
        except OSError:
            stamp = -1
        with self._lock:
            if stamp == self._seen:
                return
            records = self.records()
            self._by_key = {r.key: r for r in records if r.question_set is None}
            self._sets = [r for r in records if r.question_set is not None]
            self._seen = stamp

    def single(self, key: str) -> FitRecord | None:
        """The fit for one question's content, if any."""
        self._refresh()
        return self._by_key.get(key)

    def for_set(self, keys: set[str]) -> list[FitRecord]:
        """Question-set fits whose whole set is among `keys` (the request asks every question of it)."""
        self._refresh()
        return [r for r in self._sets if r.question_set is not None and set(r.question_set) <= keys]
