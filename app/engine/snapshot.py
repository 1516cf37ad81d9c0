"""A prefix snapshot: what the engine produces and restores, and what the prefix cache keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class Snapshot:
    """The KV state of sequence 0 after prefilling `tokens` (llama_state_seq_get_data)."""

    data: bytes
    tokens: tuple[int, ...]
    # The engine's probe layer's output averaged over the rows this prefill decoded (the state, after
    # the base), where the engine reads that layer: what a state probe fit reads. Both tiers keep it.
    state_mean: NDArray[np.float32] | None = field(default=None, compare=False)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_bytes(self) -> int:
        return len(self.data)
