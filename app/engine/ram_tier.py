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
from typing import Any, NewType

import blake3

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


class RamTier:
    def __init__(self, max_entries: int, max_tokens: int) -> None:
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[CacheKey, Snapshot] = OrderedDict()  # least recently used first
        self._in_flight: dict[CacheKey, Future[Snapshot]] = {}
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
        """(snapshot, hit). Concurrent misses on one key run `build` once; the others wait for it. A
        hit holds exactly `prefix`."""
        if not self.enabled:
            return build(), False
        with self._lock:
            snapshot = self._lookup(key, prefix)
            if snapshot is not None:
                self._hits += 1
                return snapshot, True
            future = self._in_flight.get(key)
            leader = future is None
            if future is None:
                future = self._in_flight[key] = Future()
                self._misses += 1
        if not leader:
            with self._lock:
                self._waiting += 1
            try:
                shared = future.result()
            except Exception:
                shared = None  # the leader failed; try on our own rather than share its fate
            finally:
                with self._lock:
                    self._waiting -= 1
            if shared is not None and shared.holds(prefix):
                with self._lock:
                    self._hits += 1
                return shared, True
            return build(), False
        try:
            snapshot = build()
            with self._lock:
                self._put(key, snapshot)
            future.set_result(snapshot)
            return snapshot, False
        except BaseException as error:
            future.set_exception(error)
            raise
        finally:
            with self._lock:
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
