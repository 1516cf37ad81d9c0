"""Contextual calibration ("Calibrate Before Use", Zhao et al. 2021): the content-free priors.

A small model prefers some labels whatever the text says ("Yes", "A", the middle level).
We estimate that prior per question by asking the same question about content-free states
("N/A" and the empty string), average the label probabilities, and divide them out:

    p_calibrated(label) ∝ (p(label | state) / p(label | content-free)) ^ (1 / T)

T (the model's calibration temperature, or a decision model's own) rescales the result's
confidence; it never changes which answer is the most likely.

A question's prior does not depend on the state, so it is computed once per distinct
question (its suffix tokens after its base: the system prompt, or in the question-first
layout the system prompt and the question set) and kept in a bounded LRU. Each question's
content-free runs are decoded after that base snapshot in a batch of their own: riding in a
request's batch would cost the same compute on a CPU but tie the prior's floating-point
rounding, and the real questions', to whatever else shared the batch, and a request must
answer bit-identically whether or not its questions' priors were already known.

A `PriorStore` (the snapshot disk tier) keeps priors across restarts: a stored prior is the
same numbers a new measurement would give (the same decode, written as exact binary floats).
"""

from __future__ import annotations

import math
import struct
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from app.calibration.scoring import softmax
from app.engine.disk_tier import DiskTier
from app.engine.engine import Readout, SuffixTokens
from app.engine.ram_tier import CacheKey, cache_key
from app.engine.snapshot import Prefix, Snapshot

CONTENT_FREE_STATES = ("N/A", "")
MAX_PRIORS = 4096

Measure = Callable[[Snapshot, list[SuffixTokens]], list[Readout]]


class PriorStore(Protocol):
    """Priors by the tokens they were measured on (base + suffix), as bytes."""

    def load(self, tokens: tuple[int, ...]) -> bytes | None: ...

    def save(self, tokens: tuple[int, ...], data: bytes) -> None: ...


class Priors:
    """Each question's content-free prior, measured once per base and suffix and kept (bounded)."""

    def __init__(
        self,
        content_free_tokens: Sequence[Sequence[int]],
        measure: Measure,
        store: PriorStore | None = None,
    ) -> None:
        """`content_free_tokens`: each stand-in state's tokens, as they follow the system prompt;
        `measure`: decodes suffixes after a base snapshot and returns their readouts."""
        self._stand_ins = [tuple(tokens) for tokens in content_free_tokens]
        self._measure = measure
        self._store = store
        # (base tokens, suffix) -> label -> p
        self._priors: OrderedDict[tuple[tuple[int, ...], tuple[int, ...]], dict[int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def prior(self, base: Snapshot, suffix: tuple[int, ...], labels: Sequence[int]) -> list[float]:
        """p(label | content-free state) in `labels` order, measured once per base and question suffix.

        The measurement depends on those alone (labels in token-id order, its own decode), so a
        prior is the same number whenever and alongside whatever it is first measured.
        """
        key = (base.tokens, suffix)
        with self._lock:
            known = self._priors.get(key)
            if known is not None:
                self._priors.move_to_end(key)
        if known is None:
            canonical = sorted(labels)
            stored = self._store.load((*base.tokens, *suffix)) if self._store is not None else None
            known = _parse(stored, canonical) if stored is not None else None
            if known is None:
                known = self._measured(base, suffix, canonical)
            with self._lock:
                self._priors[key] = known
                while len(self._priors) > MAX_PRIORS:
                    self._priors.popitem(last=False)
        return [known[label] for label in labels]

    def _measured(self, base: Snapshot, suffix: tuple[int, ...], canonical: list[int]) -> dict[int, float]:
        readouts = self._measure(base, [SuffixTokens((*stand_in, *suffix), canonical) for stand_in in self._stand_ins])
        runs = [softmax(r.label_logits) for r in readouts]
        known = {label: math.fsum(p) / len(runs) for label, p in zip(canonical, zip(*runs, strict=True), strict=True)}
        if self._store is not None:
            self._store.save((*base.tokens, *suffix), _packed(known))
        return known

    def __len__(self) -> int:
        with self._lock:
            return len(self._priors)


def divide(probabilities: Sequence[float], prior: Sequence[float], temperature: float) -> list[float]:
    """The probabilities with the prior divided out, at `temperature`."""
    # Dividing in log space keeps tiny priors finite; softmax renormalises.
    return softmax(
        [
            (math.log(max(p, 1e-300)) - math.log(max(q, 1e-300))) / temperature
            for p, q in zip(probabilities, prior, strict=True)
        ]
    )


def _packed(prior: dict[int, float]) -> bytes:
    """A prior as stored: its labels in order (int32), then each one's probability (float64), little-endian:
    exact, and of one size on every machine (a file's size says nothing of the CPU that measured it)."""
    labels = sorted(prior)
    return struct.pack(f"<{len(labels)}i{len(labels)}d", *labels, *(prior[label] for label in labels))


def _parse(stored: bytes, labels: list[int]) -> dict[int, float] | None:
    """A stored prior for exactly these labels, or None (then it is measured again)."""
    layout = f"<{len(labels)}i{len(labels)}d"
    if len(stored) != struct.calcsize(layout):
        return None
    values = struct.unpack(layout, stored)
    found = dict(zip(values[: len(labels)], values[len(labels) :], strict=True))
    return found if list(found) == labels and all(math.isfinite(p) for p in found.values()) else None


class DiskPriors:
    """Priors kept by the disk tier beside the snapshots: twelve bytes a label, verified like them
    (build, model, KV settings, the tokens they were measured on)."""

    def __init__(self, disk: DiskTier, fingerprint: bytes, kv_settings: str) -> None:
        self._disk = disk
        self._prefix = (b"calibration prior", fingerprint, kv_settings, "|".join(CONTENT_FREE_STATES))

    def _key(self, tokens: tuple[int, ...]) -> CacheKey:
        return cache_key(*self._prefix, array("I", tokens).tobytes())

    def load(self, tokens: tuple[int, ...]) -> bytes | None:
        found = self._disk.load(self._key(tokens), Prefix(tokens))
        return found.data if found is not None else None

    def save(self, tokens: tuple[int, ...], data: bytes) -> None:
        self._disk.save(self._key(tokens), Snapshot(data, tokens))
