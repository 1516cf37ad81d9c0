"""RamTier: prefix KV snapshots in an LRU bounded by entries and by tokens.

Pure Python and thread-safe. Snapshots are immutable `bytes`, so a reader holding one
is never affected by later evictions or by other readers. Every operation is O(1) apart
from comparing the prefix tokens of a hit, which is what makes a hash collision a miss
instead of a wrong answer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NewType

import blake3

from app.engine.caller import Caller, Signal, current, wait_either, working_for
from app.engine.snapshot import Prefix, Snapshot

CacheKey = NewType("CacheKey", bytes)


def cache_key(*parts: str | bytes) -> CacheKey:
    """blake3 over length-prefixed parts, so ("ab", "c") and ("a", "bc") differ."""
    hasher = blake3.blake3()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        hasher.update(len(data).to_bytes(8, "little"))
        hasher.update(data)
    return CacheKey(hasher.digest())


@dataclass(frozen=True)
class _Flight:
    """One build of a key under way: whom its leader builds for (promoted when an interactive caller
    waits for it), and what it will end with."""

    builder: Caller
    outcome: Future[Snapshot] = field(default_factory=Future)


def _outcome(flight: _Flight, caller: Caller) -> Snapshot | None:
    """The snapshot `flight` ends with, or None if it failed; Cancelled once `caller` is stopped first."""
    ended = Signal()
    flight.outcome.add_done_callback(lambda _: ended.set())
    wait_either(ended, caller.stop)
    if not flight.outcome.done():
        caller.check("the prefill of the same state by another request")
    try:
        return flight.outcome.result()
    except Exception:
        return None  # the leader's error is its own: this caller tries again


class RamTier:
    def __init__(self, max_entries: int, max_tokens: int) -> None:
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[CacheKey, Snapshot] = OrderedDict()  # least recently used first
        self._in_flight: dict[CacheKey, _Flight] = {}
        self._lock = threading.Lock()
        self._tokens = 0
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._collisions = 0
        self._oversized = 0
        self._dropped = 0
        self._waiting = 0  # requests waiting for another request's prefill of the same prefix

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_tokens > 0

    def put(self, key: CacheKey, snapshot: Snapshot) -> bool:
        """Store as most recently used, evicting the least recently used until both bounds hold."""
        with self._lock:
            return self._put(key, snapshot)

    def evict(self, key: CacheKey) -> None:
        """Drop an entry that turned out to be unusable (e.g. llama.cpp refused to restore it)."""
        with self._lock:
            if self._remove(key) is not None:
                self._dropped += 1

    def get_or_build(self, key: CacheKey, prefix: Prefix, build: Callable[[], Snapshot]) -> tuple[Snapshot, bool]:
        """(snapshot, hit). Concurrent misses on one key run `build` once (single flight); the others wait
        for it, each leaving its wait (Cancelled) once its own caller is stopped. An interactive caller
        that waits for a background build (a fit's) promotes it: the build goes on in the interactive lane,
        ahead of other background work. One leader whose build failed or was stopped is followed by one new
        leader among those still waiting. A hit holds exactly `prefix`."""
        if not self.enabled:
            return build(), False
        caller = current()
        while True:
            with self._lock:
                snapshot = self._lookup(key, prefix)
                if snapshot is not None:
                    self._hits += 1
                    return snapshot, True
                flight = self._in_flight.get(key)
                if flight is None:
                    flight = self._in_flight[key] = _Flight(caller.on_behalf())
                    self._misses += 1
                    break
                if caller.lane == "interactive":
                    flight.builder.promote()  # before it counts as waiting: a waiter seen is a promotion made
                self._waiting += 1
            try:
                shared = _outcome(flight, caller)
            finally:
                with self._lock:
                    self._waiting -= 1
            if shared is not None and shared.holds(prefix):
                with self._lock:
                    self._hits += 1
                return shared, True
            # the leader failed or was stopped (or built another prefix under this key): elect again
        try:
            with working_for(flight.builder):
                snapshot = build()
            with self._lock:
                self._put(key, snapshot)
            flight.outcome.set_result(snapshot)
            return snapshot, False
        except BaseException as error:
            flight.outcome.set_exception(error)
            raise
        finally:
            with self._lock:
                if self._in_flight.get(key) is flight:
                    del self._in_flight[key]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "enabled": self.enabled,
                "entries": len(self._entries),
                "tokens": self._tokens,
                "bytes": self._bytes,
                "hits": self._hits,
                "misses": self._misses,
                "evictions": self._evictions,
                "collisions": self._collisions,
                "oversized": self._oversized,
                "dropped": self._dropped,
                "waiting": self._waiting,
                "max_entries": self.max_entries,
                "max_tokens": self.max_tokens,
            }

    # The methods below expect self._lock to be held.

    def _lookup(self, key: CacheKey, prefix: Prefix) -> Snapshot | None:
        snapshot = self._entries.get(key)
        if snapshot is None:
            return None
        if not snapshot.holds(prefix):
            self._collisions += 1
            return None
        self._entries.move_to_end(key)
        return snapshot

    def _put(self, key: CacheKey, snapshot: Snapshot) -> bool:
        if not self.enabled:
            return False
        if snapshot.n_tokens > self.max_tokens:
            self._oversized += 1
            return False
        self._remove(key)
        self._entries[key] = snapshot
        self._tokens += snapshot.n_tokens
        self._bytes += snapshot.n_bytes
        while len(self._entries) > self.max_entries or self._tokens > self.max_tokens:
            _, oldest = self._entries.popitem(last=False)
            self._forget(oldest)
            self._evictions += 1
        return True

    def _remove(self, key: CacheKey) -> Snapshot | None:
        snapshot = self._entries.pop(key, None)
        if snapshot is not None:
            self._forget(snapshot)
        return snapshot

    def _forget(self, snapshot: Snapshot) -> None:
        self._tokens -= snapshot.n_tokens
        self._bytes -= snapshot.n_bytes
