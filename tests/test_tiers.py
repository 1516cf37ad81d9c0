"""PrefixCache (app/engine/tiers.py) alone, on the tiny model: where a prefix snapshot comes from,
what a prefill costs, and a dropped snapshot is prefilled anew."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.caller import Caller, Signal, working_for
from app.engine.disk_tier import DiskTier
from app.engine.engine import Engine, Timing
from app.engine.ram_tier import RamTier, cache_key
from app.engine.snapshot import Prefix, Snapshot
from app.engine.snapshot_file import SnapshotIdentity
from app.engine.tiers import PrefixCache
from app.errors import Cancelled
from tests.support.settings import GPU_LAYERS

STOPPED = Caller(stop=Signal())
STOPPED.stop.set()  # nobody waits for this caller's answer any more


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
    base, _ = engine.prefill(Prefix(tuple(engine.vocab.tokenize("System part. "))))
    tokens = (*base.tokens, *engine.vocab.tokenize("A state of a few words.", add_bos=False))
    key = cache_key("test", repr(tokens))
    disk = disk_for(engine, tmp_path)
    tiers = PrefixCache(engine, RamTier(4, 4096), disk)
    timing = Timing()
    first = tiers.resolve(key, Prefix(tokens), base, timing)
    assert first.source == "miss" and tiers.prefilled_tokens == len(tokens) - base.n_tokens and timing.prefill_ms > 0
    with working_for(STOPPED):  # a hit never prefills, so a stopped caller still gets it
        again = tiers.resolve(key, Prefix(tokens), base, Timing())
    assert again.source == "hit" and again.snapshot == first.snapshot
    disk.close()  # finishes the background write
    restarted = PrefixCache(engine, RamTier(4, 4096), disk_for(engine, tmp_path))
    from_disk = restarted.resolve(key, Prefix(tokens), base, Timing())
    assert from_disk.source == "disk" and from_disk.snapshot.data == first.snapshot.data
    assert restarted.prefilled_tokens == 0
    restarted.drop(key)
    assert restarted.resolve(key, Prefix(tokens), base, Timing()).source == "miss"


def test_a_snapshot_forgotten_on_purpose_is_a_miss_and_no_failed_restore(engine: Engine, tmp_path: Path) -> None:
    """forget (a state to be answered as new: onepass calibrate's served cost) leaves both tiers as drop
    does (a snapshot llama.cpp refused to restore), but counts and logs no rejected file."""
    base, _ = engine.prefill(Prefix(tuple(engine.vocab.tokenize("System part. "))))
    tokens = (*base.tokens, *engine.vocab.tokenize("A state to forget.", add_bos=False))
    key = cache_key("forget", repr(tokens))
    for leave, rejected in (("forget", {}), ("drop", {"restore": 1})):
        disk = disk_for(engine, tmp_path / leave)
        tiers = PrefixCache(engine, RamTier(4, 4096), disk)
        tiers.resolve(key, Prefix(tokens), base, Timing())
        disk.close()  # the file written
        disk = disk_for(engine, tmp_path / leave)
        tiers = PrefixCache(engine, RamTier(4, 4096), disk)
        assert tiers.resolve(key, Prefix(tokens), base, Timing()).source == "disk"
        getattr(tiers, leave)(key)
        assert tiers.resolve(key, Prefix(tokens), base, Timing()).source == "miss"
        assert dict(disk.stats()["rejected"]) == rejected, leave
        disk.close()


def test_a_cancelled_request_stops_before_the_prefill_and_no_ram_tier_reads_off(engine: Engine) -> None:
    tokens = tuple(engine.vocab.tokenize("Another state entirely."))
    tiers = PrefixCache(engine, RamTier(4, 4096))
    with working_for(STOPPED), pytest.raises(Cancelled):
        tiers.resolve(cache_key("c"), Prefix(tokens), None, Timing())
    assert tiers.prefilled_tokens == 0
    off = PrefixCache(engine, RamTier(0, 0))
    assert off.resolve(cache_key("o"), Prefix(tokens), None, Timing()).source == "off"


def test_a_state_mean_kept_on_disk_comes_back_and_a_file_without_one_is_prefilled_and_rewritten(
    tiny_chat_path: Path, tmp_path: Path
) -> None:
    """A state probe reads the state's mean: after a restart it is a disk hit with the mean, bit for
    bit; a file without a mean (an older onepass's) is prefilled again once where the mean is wanted,
    and rewritten with it."""
    tapped = Engine(tiny_chat_path, n_ctx=1024, threads=1, n_gpu_layers=GPU_LAYERS, probe_layer="middle")
    try:
        base, _ = tapped.prefill(Prefix(tuple(tapped.vocab.tokenize("System part. "))))
        tokens = (*base.tokens, *tapped.vocab.tokenize("A state with a mean.", add_bos=False))
        key = cache_key("mean", repr(tokens))
        disk = disk_for(tapped, tmp_path)
        first = PrefixCache(tapped, RamTier(4, 4096), disk).resolve(
            key, Prefix(tokens), base, Timing(), state_mean=True
        )
        assert first.source == "miss" and first.snapshot.state_mean is not None
        disk.close()
        restarted = PrefixCache(tapped, RamTier(4, 4096), disk_for(tapped, tmp_path))
        kept = restarted.resolve(key, Prefix(tokens), base, Timing(), state_mean=True)
        assert kept.source == "disk" and kept.snapshot.state_mean is not None
        assert kept.snapshot.state_mean.tobytes() == first.snapshot.state_mean.tobytes()

        older, oldest = tmp_path / "older", tmp_path / "oldest"
        for folder in (older, oldest):
            written = disk_for(tapped, folder)
            written.save(key, Snapshot(first.snapshot.data, first.snapshot.tokens))  # no mean
            written.close()
        direct = PrefixCache(tapped, RamTier(4, 4096), disk_for(tapped, oldest))  # wanted from the first request
        found = direct.resolve(key, Prefix(tokens), base, Timing(), state_mean=True)
        assert found.source == "miss" and found.snapshot.state_mean is not None
        upgraded_disk = disk_for(tapped, older)
        upgraded = PrefixCache(tapped, RamTier(4, 4096), upgraded_disk)
        without = upgraded.resolve(key, Prefix(tokens), base, Timing())  # not wanted: the file serves as it is
        assert without.source == "disk" and without.snapshot.state_mean is None
        wanted = upgraded.resolve(key, Prefix(tokens), base, Timing(), state_mean=True)
        assert wanted.source == "miss" and wanted.snapshot.state_mean is not None
        assert wanted.snapshot.data == first.snapshot.data
        assert upgraded.resolve(key, Prefix(tokens), base, Timing(), state_mean=True).source == "hit"
        upgraded_disk.close()
        rewritten = PrefixCache(tapped, RamTier(4, 4096), disk_for(tapped, older))
        again = rewritten.resolve(key, Prefix(tokens), base, Timing(), state_mean=True)
        assert again.source == "disk" and again.snapshot.state_mean is not None
        assert again.snapshot.state_mean.tobytes() == first.snapshot.state_mean.tobytes()
    finally:
        tapped.close()
