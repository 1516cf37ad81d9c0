"""What this process asked of llama.cpp: decodes, the rows they computed, restores.

The engine keeps no counters of its own. A test that needs to know how much work a request cost
wraps llama_cpp's functions where onepass calls them (the real ones still run) and counts."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from app.engine import bindings


class LlamaCalls:
    def __init__(self) -> None:
        self.decodes = 0  # llama_decode and llama_process calls: one batch each
        self.rows = 0  # the batch rows llama_decode computed
        self.restores = 0  # snapshots copied into a context (llama_state_seq_set_data)
        self._lock = threading.Lock()  # pooled contexts decode in parallel threads

    def add(self, decodes: int = 0, rows: int = 0, restores: int = 0) -> None:
        with self._lock:
            self.decodes += decodes
            self.rows += rows
            self.restores += restores


def count_llama_calls(monkeypatch: pytest.MonkeyPatch) -> LlamaCalls:
    """Count every decode and restore from now until the test ends."""
    bindings.init()
    import llama_cpp

    calls = LlamaCalls()
    decode, process, restore = llama_cpp.llama_decode, llama_cpp.llama_process, llama_cpp.llama_state_seq_set_data

    def counted_decode(ctx: Any, batch: Any) -> Any:
        status = decode(ctx, batch)
        calls.add(decodes=1, rows=batch.n_tokens)
        return status

    def counted_process(ctx: Any, kind: Any, batch: Any) -> Any:
        status = process(ctx, kind, batch)
        calls.add(decodes=1)
        return status

    def counted_restore(*args: Any) -> Any:
        read = restore(*args)
        calls.add(restores=1)
        return read

    monkeypatch.setattr(llama_cpp, "llama_decode", counted_decode)
    monkeypatch.setattr(llama_cpp, "llama_process", counted_process)
    monkeypatch.setattr(llama_cpp, "llama_state_seq_set_data", counted_restore)
    return calls
