"""Contextual calibration ("Calibrate Before Use", Zhao et al. 2021).

A small model prefers some labels whatever the text says ("Yes", "A", the middle level).
We estimate that prior per question by asking the same question about content-free states
("N/A" and the empty string), average the label probabilities, and divide them out:

    p_calibrated(label) ∝ p(label | state) / p(label | content-free)

A question's prior does not depend on the state, so it is computed once per distinct
question (its suffix tokens and label order) and kept in a bounded LRU. The content-free
runs are decoded after the system-prompt snapshot, in a batch of their own: riding in the
request's batch would cost the same compute on a CPU but could shift the real questions'
floating-point rounding (kernels pick tiles by batch size), and a request must answer
bit-identically whether or not its questions' priors were already known.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence

from app.engine import Job, Readout
from app.scoring import softmax

CONTENT_FREE_STATES = ("N/A", "")
MAX_PRIORS = 4096

PriorKey = tuple[tuple[int, ...], tuple[int, ...]]  # (suffix tokens, label ids in answer order)


class ContextualCalibrator:
    def __init__(self, content_free_tokens: Sequence[Sequence[int]]) -> None:
        """`content_free_tokens`: each stand-in state's tokens, as they follow the system prompt."""
        self._stand_ins = [tuple(tokens) for tokens in content_free_tokens]
        self._priors: OrderedDict[PriorKey, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def missing(self, keys: Sequence[PriorKey]) -> list[PriorKey]:
        """Distinct keys with no prior yet, in first-seen order."""
        with self._lock:
            return [key for key in dict.fromkeys(keys) if key not in self._priors]

    def jobs(self, keys: Sequence[PriorKey]) -> list[Job]:
        """The content-free runs (after the system prompt) that estimate the priors of `keys`."""
        return [Job((*stand_in, *suffix), labels) for suffix, labels in keys for stand_in in self._stand_ins]

    def learn(self, keys: Sequence[PriorKey], readouts: Sequence[Readout]) -> None:
        """Store the priors measured by `jobs(keys)`."""
        per_key = len(self._stand_ins)
        with self._lock:
            for i, key in enumerate(keys):
                runs = [softmax(r.label_logits) for r in readouts[i * per_key : (i + 1) * per_key]]
                self._priors[key] = [math.fsum(p) / per_key for p in zip(*runs, strict=True)]
                self._priors.move_to_end(key)
            while len(self._priors) > MAX_PRIORS:
                self._priors.popitem(last=False)

    def calibrate(self, key: PriorKey, probabilities: Sequence[float]) -> list[float]:
        with self._lock:
            prior = self._priors[key]
            self._priors.move_to_end(key)
        # Dividing in log space keeps tiny priors finite; softmax renormalises.
        return softmax(
            [math.log(max(p, 1e-300)) - math.log(max(q, 1e-300)) for p, q in zip(probabilities, prior, strict=True)]
        )

    def __len__(self) -> int:
        with self._lock:
            return len(self._priors)
