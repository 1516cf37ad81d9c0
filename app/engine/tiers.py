"""The prefix cache: a prefix's snapshot found through its tiers, the RAM tier (one build per key at a
time), then the verified disk tier, then a prefill from a base snapshot, which both tiers then keep."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.engine.caller import current
from app.engine.disk_tier import DiskTier
from app.engine.engine import Engine, Timing
from app.engine.prefill import Partial, Stopped
from app.engine.ram_tier import CacheKey, RamTier, cache_key
from app.engine.snapshot import Prefix, Snapshot

Source = Literal["hit", "disk", "miss", "off"]
# Stopped prefills whose work is kept for a retry: each may hold up to a context's worth of KV bytes,
# which no budget of the RAM tier counts.
MAX_PARTIALS = 2


@dataclass(frozen=True)
class ResolvedPrefix:
    """A prefix's snapshot, and where it came from."""

    snapshot: Snapshot
    source: Source  # where it came from: the RAM tier, the disk tier, a prefill; "off": no RAM tier


class PrefixCache:
    """Snapshots of prefixes of one model: its RAM tier and its disk tier (None: no disk tier)."""

    def __init__(
        self,
        engine: Engine,
        ram: RamTier,
        disk: DiskTier | None = None,
        key_fn: Callable[..., CacheKey] = cache_key,
    ) -> None:
        """`key_fn`: a test hook (a constant key forces hash collisions)."""
        self.engine = engine
        self.ram = ram
        self.disk = disk
        self._key_fn = key_fn
        self.prefilled_tokens = 0  # tokens prefilled so far (for /metrics)
        self._lock = threading.Lock()  # the counter and the partials: pooled contexts prefill in parallel threads
        # stopped prefills' work by key, for a retry to go on from; oldest first
        self._partials: OrderedDict[CacheKey, Partial] = OrderedDict()

    def key(self, *parts: str | bytes) -> CacheKey:
        """A prefix's key: the model, the KV settings, and `parts`, what else shapes its snapshot's bytes."""
        return self._key_fn(self.engine.fingerprint, self.engine.kv_settings, *parts)

    def resolve(
        self, key: CacheKey, prefix: Prefix, base: Snapshot | None, timing: Timing, state_mean: bool = False
    ) -> ResolvedPrefix:
        """The snapshot of `prefix` (its image files read only by a prefill); a prefill starts from `base`
        (a snapshot of a prefix of it) or from nothing. Reading a disk file counts as restoring in
        `timing`, a prefill as prefilling. `state_mean`: one with its state mean where the engine reads
        one (a prefill from `base` gives it, and both tiers keep it; a snapshot kept without it is
        prefilled again and replaces the kept one)."""
        from_disk = False
        state_mean = state_mean and base is not None and self.engine.probe_layer is not None

        def prefilled() -> Snapshot:
            current().check("the prefill")
            resume = self._partial(key)
            try:
                snapshot, spent = self.engine.prefill(prefix, base=base, resume=resume)
            except Stopped as stopped:
                self._keep(key, stopped.partial or resume)
                raise
            with self._lock:
                self.prefilled_tokens += len(prefix.tokens) - (base.n_tokens if base is not None else 0)
            timing.restore_ms += spent.restore_ms
            timing.prefill_ms += spent.prefill_ms
            return snapshot

        def build() -> Snapshot:
            nonlocal from_disk
            if self.disk is not None:
                began = time.perf_counter()
                loaded = self.disk.load(key, prefix)
                timing.restore_ms += (time.perf_counter() - began) * 1000
                if loaded is not None:
                    from_disk = True
                    return loaded
            snapshot = prefilled()
            if self.disk is not None:
                self.disk.save(key, snapshot)  # in the background
            return snapshot

        snapshot, hit = self.ram.get_or_build(key, prefix, build)
        # kept without it (an older onepass's file): prefilled again, and both tiers keep the new one
        if state_mean and snapshot.state_mean is None:
            snapshot, hit, from_disk = prefilled(), False, False
            self.ram.put(key, snapshot)
            if self.disk is not None:
                self.disk.save(key, snapshot, replace=True)
        source: Source = "off" if not self.ram.enabled else "hit" if hit else "disk" if from_disk else "miss"
        return ResolvedPrefix(snapshot, source)

    def _partial(self, key: CacheKey) -> Partial | None:
        """The work of a stopped prefill of the prefix under `key`, taken out (a prefill goes on from it)."""
        with self._lock:
            return self._partials.pop(key, None)

    def _keep(self, key: CacheKey, partial: Partial | None) -> None:
        """Keep a stopped prefill's work for the next prefill of the same prefix (a client's retry), the
        most recent MAX_PARTIALS of them: outside the RAM tier's budget, so few."""
        if partial is None:
            return
        with self._lock:
            self._partials[key] = partial
            self._partials.move_to_end(key)
            while len(self._partials) > MAX_PARTIALS:
                self._partials.popitem(last=False)

    def drop(self, key: CacheKey) -> None:
        """A snapshot that failed to restore: out of both tiers, so the next resolve prefills it anew."""
        self._partial(key)
        self.ram.evict(key)
        if self.disk is not None:
            self.disk.discard(key)

    def forget(self, key: CacheKey) -> None:
        """A good snapshot out of both tiers on purpose, so the next resolve prefills it anew."""
        self._partial(key)
        self.ram.evict(key)
        if self.disk is not None:
            self.disk.forget(key)
