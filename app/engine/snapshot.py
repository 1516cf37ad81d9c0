"""A prefix snapshot: what the engine produces and restores, and what the session cache keeps."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    """The KV state of sequence 0 after prefilling `tokens` (llama_state_seq_get_data)."""

    data: bytes
    tokens: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_bytes(self) -> int:
        return len(self.data)
