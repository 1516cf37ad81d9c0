"""PrefixCache (app/engine/tiers.py) alone, on the tiny model: where a prefix snapshot comes from,
what a prefill costs, and a dropped snapshot is prefilled anew."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.disk_tier import DiskTier, SnapshotIdentity
from app.engine.llama import Engine, Timing
from app.engine.ram_tier import RamTier, cache_key
from app.engine.tiers import PrefixCache
from app.errors import Cancelled
from tests.conftest import GPU_LAYERS


@pytest.fixture(scope="module")
def engine(tiny_chat_path: Path) -> Iterator[Engine]:
    engine = Engine(tiny_chat_path, n_ctx=1024, threads=1, n_gpu_layers=GPU_LAYERS)
    yield engine
    engine.close()


def disk_for(engine: Engine, folder: Path) -> DiskTier:
    return DiskTier(folder, 1 << 30, SnapshotIdentity(engine.build, engine.fingerprint.hex(), engine.kv_settings))


def test_a_prefix_is_prefilled_once_then_a_ram_hit_and_after_a_restart_a_disk_hit(
    engine: Engine, tmp_path: Path
) -> None:
    base, _ = engine.prefill(engine.tokenize("System part. "))
    tokens = (*base.tokens, *engine.tokenize("A state of a few words.", add_bos=False))
    key = cache_key("test", repr(tokens))
    disk = disk_for(engine, tmp_path)
    tiers = PrefixCache(engine, RamTier(4, 4096), disk)
    timing = Timing()
    first = tiers.resolve(key, tokens, base, timing)
    assert first.source == "miss" and tiers.prefilled_tokens == len(tokens) - base.n_tokens and timing.prefill_ms > 0
    again = tiers.resolve(key, tokens, base, Timing(), cancelled=lambda: True)  # a hit never prefills
    assert again.source == "hit" and again.snapshot == first.snapshot
    disk.close()  # finishes the background write
    restarted = PrefixCache(engine, RamTier(4, 4096), disk_for(engine, tmp_path))
    from_disk = restarted.resolve(key, tokens, base, Timing())
    assert from_disk.source == "disk" and from_disk.snapshot.data == first.snapshot.data
    assert restarted.prefilled_tokens == 0
    restarted.drop(key)
    assert restarted.resolve(key, tokens, base, Timing()).source == "miss"


def test_a_cancelled_request_stops_before_the_prefill_and_no_ram_tier_reads_off(engine: Engine) -> None:
    tokens = tuple(engine.tokenize("Another state entirely."))
    tiers = PrefixCache(engine, RamTier(4, 4096))
    with pytest.raises(Cancelled):
        tiers.resolve(cache_key("c"), tokens, None, Timing(), cancelled=lambda: True)
    assert tiers.prefilled_tokens == 0
    off = PrefixCache(engine, RamTier(0, 0))
    assert off.resolve(cache_key("o"), tokens, None, Timing()).source == "off"
