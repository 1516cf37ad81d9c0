"""The evidence a fitting run has answered, kept as it is answered so that a run that dies or is
interrupted resumes without answering again.

One file per example, in an `evidence/` folder beside the fits it is for (one folder per model file
and prompt), named by a digest of everything that shaped the answer: the fits' identity (model file
and prompt), the llama.cpp build and KV settings, whether hidden vectors (and the state's mean)
were read, and the example's state and questions in their order. A file is written whole (a
temporary file renamed over) and carries a digest of its content; one that does not verify is
answered again. The answers are not part of the key: relabelling an example reuses its evidence.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path
from typing import Any

import blake3
import numpy as np

from app.calibration import Evidence
from app.paths import write_atomically
from app.wire.contract import SystemOneRequest

log = logging.getLogger("onepass.journal")
SUFFIX = ".evidence.json"


def _digest(fields: dict[str, Any]) -> str:
    return blake3.blake3(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _vector(vector: np.ndarray[Any, Any] | None) -> str | None:
    return None if vector is None else base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def _unvector(text: str | None) -> np.ndarray[Any, np.dtype[np.float32]] | None:
    return (
        None if text is None else np.frombuffer(base64.b64decode(text, validate=True), dtype="<f4").astype(np.float32)
    )


def _encode(evidence: Evidence) -> dict[str, Any]:
    return {
        "labels": evidence.labels,
        "raw": evidence.raw,
        "prior": evidence.prior,
        "hidden": _vector(evidence.hidden),
        "state_mean": _vector(evidence.state_mean),
        "mass": evidence.mass,
    }


def _decode(data: dict[str, Any]) -> Evidence:
    return Evidence(
        [str(x) for x in data["labels"]],
        [float(x) for x in data["raw"]],
        [float(x) for x in data["prior"]],
        _unvector(data["hidden"]),
        _unvector(data["state_mean"]),
        None if data.get("mass") is None else float(data["mass"]),  # files written before it was kept have none
    )


class EvidenceJournal:
    """The answered evidence of one model file, prompt and build (`identity`), in `folder`."""

    def __init__(self, folder: Path, identity: str) -> None:
        self.folder = folder
        self.identity = identity

    def key(self, request: SystemOneRequest, hidden: bool) -> str:
        # In the request's own order: the order of the questions and options shapes the prompt.
        shown = json.dumps(request.model_dump(mode="json", exclude={"model"}), ensure_ascii=False)
        media = request.media  # the images by identity, where they go and what names them
        shown += json.dumps([[i.sha256 for i in media.images], media.placeholders, media.fields])
        return blake3.blake3(f"{self.identity}\0{int(hidden)}\0{shown}".encode()).hexdigest()[:32]

    def load(self, request: SystemOneRequest, hidden: bool) -> dict[str, Evidence] | None:
        """The example's evidence if a sound file holds it, else None (a damaged file is answered again)."""
        key = self.key(request, hidden)
        path = self.folder / f"{key}{SUFFIX}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            log.warning("answering again: evidence file %s unreadable (%s)", path, error)
            return None
        try:
            fields = {k: v for k, v in data.items() if k != "digest"}
            if data["digest"] != _digest(fields) or fields["key"] != key:
                raise ValueError("its digest does not match")
            found = {qid: _decode(e) for qid, e in fields["evidence"].items()}
            if set(found) != set(request.questions):
                raise ValueError("it holds other questions")
        except (KeyError, TypeError, ValueError) as error:
            log.warning("answering again: evidence file %s does not verify (%s)", path, error)
            return None
        return found

    def save(self, request: SystemOneRequest, hidden: bool, evidence: dict[str, Evidence]) -> None:
        key = self.key(request, hidden)
        fields = {"key": key, "evidence": {qid: _encode(e) for qid, e in evidence.items()}}
        text = json.dumps({**fields, "digest": _digest(fields)}, sort_keys=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        # Synced: the journal is what lets a run that dies, a power cut included, resume without
        # answering again, and one sync costs little beside answering an example.
        write_atomically(self.folder / f"{key}{SUFFIX}", [text.encode()])
