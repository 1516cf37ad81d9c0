"""The snapshot disk tier on its own: round trips, every kind of bad file, the byte budget,
a full disk, a read-only or vanished folder, two tiers on one folder."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.engine.disk_tier import SUFFIX, DiskTier
from app.engine.ram_tier import CacheKey, cache_key
from app.engine.snapshot import Prefix, Snapshot
from app.engine.snapshot_file import MAGIC, SnapshotIdentity, read_snapshot
from tests.support.skip_groups import skip

IDENTITY = SnapshotIdentity(build="llama-cpp-python 0.0; test", model="ab" * 32, kv="n_ctx=64")
FLUSH_S = 30.0


def snapshot(n_tokens: int, seed: int = 0, payload: int = 4096) -> Snapshot:
    return Snapshot(bytes((seed + i) % 251 for i in range(payload)), tuple(range(seed, seed + n_tokens)))


def written(folder: Path, snap: Snapshot, identity: SnapshotIdentity = IDENTITY) -> tuple[DiskTier, CacheKey]:
    tier = DiskTier(folder, 1 << 30, identity)
    key = cache_key("a")
    tier.save(key, snap)
    assert tier.flush(FLUSH_S)
    return tier, key


def test_a_snapshot_comes_back_whole_after_a_restart(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    snap = snapshot(10)
    first, key = written(tmp_path, snap)
    assert first.load(key, Prefix(snap.tokens)) == snap
    first.close()
    with caplog.at_level(logging.INFO, logger="onepass.disk"):
        second = DiskTier(tmp_path, 1 << 30, IDENTITY)  # a new process's tier on the same folder
    assert ": 1 files" in caplog.text
    loaded = second.load(key, Prefix(snap.tokens))
    assert loaded == snap and loaded is not snap
    stats = second.stats()
    assert (stats["entries"], stats["hits"], stats["misses"]) == (1, 1, 0)
    assert stats["read_bytes"] == snap.n_bytes
    assert not [p for p in tmp_path.iterdir() if not p.name.endswith(SUFFIX)]  # no temporary files left


def test_an_absent_snapshot_is_a_miss(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 30, IDENTITY)
    assert tier.load(cache_key("nothing"), Prefix((1, 2))) is None
    assert tier.stats()["misses"] == 1


def test_other_tokens_under_the_same_key_are_a_collision_not_a_rejection(tmp_path: Path) -> None:
    snap = snapshot(10)
    tier, key = written(tmp_path, snap)
    assert tier.load(key, Prefix((*snap.tokens[:-1], 999))) is None
    assert tier.stats()["collisions"] == 1 and tier.stats()["rejected"] == {}
    assert tier.load(key, Prefix(snap.tokens)) == snap  # the file is sound and stays


def file_of(folder: Path, key: CacheKey) -> Path:
    return folder / f"{key.hex()}{SUFFIX}"


def header_end(data: bytes) -> int:
    return len(MAGIC) + 4 + int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")


def damaged(data: bytes, how: str) -> bytes:
    """The file's bytes with one kind of damage."""
    end = header_end(data)
    flip = {
        "payload": len(data) - 100,
        "tokens": end + 32 + 2,
        "header": end - 5,  # inside the header's JSON
        "header_digest": end + 3,
        "magic": 0,
    }
    if how == "truncated":
        return data[: len(data) - 1000]
    if how == "extended":
        return data + b"\0"
    if how == "empty":
        return b""
    position = flip[how]
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("truncated", "truncated"),
        ("extended", "truncated"),
        ("empty", "header"),
        ("payload", "checksum"),
        ("tokens", "checksum"),
        ("header", "header"),
        ("header_digest", "header"),
        ("magic", "header"),
    ],
)
def test_a_damaged_file_is_deleted_counted_and_a_miss(tmp_path: Path, how: str, reason: str) -> None:
    snap = snapshot(10, payload=8192)
    _, key = written(tmp_path, snap)
    path = file_of(tmp_path, key)
    path.write_bytes(damaged(path.read_bytes(), how))
    restarted = DiskTier(tmp_path, 1 << 30, IDENTITY)
    assert restarted.load(key, Prefix(snap.tokens)) is None
    assert restarted.stats()["rejected"] == {reason: 1}
    assert restarted.stats()["misses"] == 1
    assert not path.exists()


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("model", SnapshotIdentity(IDENTITY.build, "cd" * 32, IDENTITY.kv)),
        ("kv", SnapshotIdentity(IDENTITY.build, IDENTITY.model, "n_ctx=128")),
        ("build", SnapshotIdentity("llama-cpp-python 0.1; test", IDENTITY.model, IDENTITY.kv)),
    ],
)
def test_a_file_written_by_another_model_build_or_kv_setting_is_rejected(
    tmp_path: Path, field: str, other: SnapshotIdentity
) -> None:
    snap = snapshot(10)
    _, key = written(tmp_path, snap, identity=other)
    tier = DiskTier(tmp_path, 1 << 30, IDENTITY)
    assert tier.load(key, Prefix(snap.tokens)) is None
    assert tier.stats()["rejected"] == {field: 1}
    assert not file_of(tmp_path, key).exists()


def test_a_file_is_the_same_size_whatever_the_build_it_was_written_by(tmp_path: Path) -> None:
    """The build's text names the CPU's instruction sets (llama.cpp's system info), so its length differs
    from machine to machine; the file, and so every size the tier reports, does not."""
    snap = snapshot(10)
    sizes = set()
    builds = ("CPU : SSE3 = 1 | AVX2 = 1", "CPU : SSE3 = 1 | AVX_VNNI = 1 | AVX512 = 1 | AVX512_BF16 = 1")
    for n, build in enumerate(builds):
        _, key = written(tmp_path / str(n), snap, SnapshotIdentity(build, IDENTITY.model, IDENTITY.kv))
        sizes.add(file_of(tmp_path / str(n), key).stat().st_size)
    assert len(sizes) == 1


def test_a_file_of_another_format_version_or_under_another_key_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = snapshot(10)
    monkeypatch.setattr("app.engine.snapshot_file.FORMAT", 0)
    _, key = written(tmp_path, snap)
    monkeypatch.undo()
    tier = DiskTier(tmp_path, 1 << 30, IDENTITY)
    assert tier.load(key, Prefix(snap.tokens)) is None
    assert tier.stats()["rejected"] == {"format": 1}
    _, key = written(tmp_path, snap)
    moved = cache_key("elsewhere")
    file_of(tmp_path, key).rename(file_of(tmp_path, moved))
    assert tier.load(moved, Prefix(snap.tokens)) is None
    assert tier.stats()["rejected"] == {"format": 1, "key": 1}


def test_an_unreadable_file_is_rejected(tmp_path: Path) -> None:
    snap = snapshot(10)
    tier, key = written(tmp_path, snap)
    path = file_of(tmp_path, key)
    path.unlink()
    path.mkdir()  # opening a folder as a file fails with an OSError other than "not found"
    assert tier.load(key, Prefix(snap.tokens)) is None
    assert tier.stats()["rejected"] == {"unreadable": 1}


def test_the_budget_evicts_the_least_recently_used_files_across_restarts(tmp_path: Path) -> None:
    snaps = [snapshot(10, seed=i, payload=10_000) for i in range(3)]
    tier = DiskTier(tmp_path, 25_000, IDENTITY)  # room for two files
    keys = [cache_key(f"s{i}") for i in range(3)]
    for key, snap in zip(keys[:2], snaps[:2], strict=True):
        tier.save(key, snap)
        assert tier.flush(FLUSH_S)
    # s0 used last: its mtime moves past s1's, so s1 is the least recently used file.
    past = os.stat(file_of(tmp_path, keys[1])).st_mtime - 10
    os.utime(file_of(tmp_path, keys[0]), (past, past))
    os.utime(file_of(tmp_path, keys[1]), (past, past))
    tier.close()
    restarted = DiskTier(tmp_path, 25_000, IDENTITY)
    assert restarted.load(keys[0], Prefix(snaps[0].tokens)) == snaps[0]  # touches s0 now
    restarted.save(keys[2], snaps[2])
    assert restarted.flush(FLUSH_S)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(file_of(tmp_path, k).name for k in (keys[0], keys[2]))
    stats = restarted.stats()
    assert stats["evictions"] == 1 and stats["entries"] == 2 and stats["bytes"] <= 25_000


def test_a_snapshot_larger_than_the_budget_is_not_written_and_evicts_nothing(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 25_000, IDENTITY)
    small, large = snapshot(10, seed=1, payload=10_000), snapshot(10, seed=2, payload=30_000)
    tier.save(cache_key("small"), small)
    tier.save(cache_key("large"), large)
    assert tier.flush(FLUSH_S)
    assert [p.name for p in tmp_path.iterdir()] == [file_of(tmp_path, cache_key("small")).name]
    stats = tier.stats()
    assert stats["oversized"] == 1 and stats["evictions"] == 0 and stats["writes"] == 1 and stats["entries"] == 1
    assert tier.load(cache_key("small"), Prefix(small.tokens)) == small


def test_a_full_write_queue_skips_writes_instead_of_blocking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = DiskTier(tmp_path, 1 << 30, IDENTITY, queue_bytes=9000)  # two of these snapshots
    entered, release = threading.Event(), threading.Event()
    write = tier._write

    def slow_write(key: CacheKey, snap: Snapshot, replace: bool) -> None:
        entered.set()
        assert release.wait(FLUSH_S)
        write(key, snap, replace)

    monkeypatch.setattr(tier, "_write", slow_write)
    tier.save(cache_key("a"), snapshot(5, 1))
    assert entered.wait(FLUSH_S)  # the writer holds "a"; the queue is empty again
    tier.save(cache_key("b"), snapshot(5, 2))  # queued
    tier.save(cache_key("c"), snapshot(5, 3))  # 3 x 4,096 bytes: skipped, at once
    assert tier.stats()["writes_skipped"] == 1
    release.set()
    assert tier.flush(FLUSH_S)
    assert tier.stats()["writes"] == 2


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at `path` (root only); skips the test where mounting is not allowed."""
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        skip("tmpfs", "mounting a tmpfs needs root: the full-disk and read-only tests do not run")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        skip("tmpfs", f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_full_disk_turns_the_tier_off_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with tmpfs(tmp_path / "small", "64k") as folder:
        tier = DiskTier(folder, 1 << 30, IDENTITY)  # the budget is beyond what the disk holds
        with caplog.at_level(logging.WARNING, logger="onepass.disk"):
            tier.save(cache_key("big"), snapshot(10, payload=200_000))
            assert tier.flush(FLUSH_S)
            tier.save(cache_key("next"), snapshot(10, payload=100))
            assert tier.flush(FLUSH_S)
        assert not tier.enabled
        assert tier.stats()["turned_off"] == {"ENOSPC": 1}
        assert tier.stats()["writes"] == 0  # the second save was not even queued
        assert len([r for r in caplog.records if "disk tier off" in r.getMessage()]) == 1
        assert list(folder.iterdir()) == []  # the partial temporary file is gone
        assert tier.load(cache_key("big"), Prefix((0,))) is None  # off: nothing read


def test_a_read_only_folder_turns_the_tier_off(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m") as folder:
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        tier = DiskTier(folder, 1 << 30, IDENTITY)
        assert not tier.enabled
        tier.save(cache_key("a"), snapshot(3))  # a no-op, never an error
        assert tier.load(cache_key("a"), Prefix((0, 1, 2))) is None


def test_a_folder_made_read_only_while_serving_turns_the_tier_off(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "1m") as folder:
        tier = DiskTier(folder, 1 << 30, IDENTITY)
        assert tier.enabled
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        tier.save(cache_key("a"), snapshot(3))
        assert tier.flush(FLUSH_S)
        assert not tier.enabled and tier.stats()["turned_off"] == {"EROFS": 1}


def test_a_vanished_folder_turns_the_tier_off(tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    tier = DiskTier(folder, 1 << 30, IDENTITY)
    shutil.rmtree(folder)
    tier.save(cache_key("a"), snapshot(3))
    assert tier.flush(FLUSH_S)
    assert not tier.enabled and tier.stats()["turned_off"] == {"ENOENT": 1}


def test_two_tiers_on_one_folder_write_one_key_at_once_and_read_each_others_files(tmp_path: Path) -> None:
    tiers = [DiskTier(tmp_path, 1 << 30, IDENTITY) for _ in range(2)]
    snaps = [snapshot(50, seed=i, payload=200_000) for i in range(8)]
    keys = [cache_key(f"s{i}") for i in range(8)]
    for key, snap in zip(keys, snaps, strict=True):
        for tier in tiers:  # both queue the key; their writers race on it
            tier.save(key, snap)
        for tier in tiers:
            assert tier.flush(FLUSH_S)
    fresh = DiskTier(tmp_path, 1 << 30, IDENTITY)
    for key, snap in zip(keys, snaps, strict=True):
        assert fresh.load(key, Prefix(snap.tokens)) == snap
    assert fresh.stats()["rejected"] == {}
    assert sum(t.stats()["writes_skipped"] for t in tiers) == 0


def test_eviction_by_one_tier_does_not_break_a_read_in_another(tmp_path: Path) -> None:
    reader = DiskTier(tmp_path, 1 << 30, IDENTITY)
    snap = snapshot(10, payload=50_000)
    key = cache_key("a")
    reader.save(key, snap)
    assert reader.flush(FLUSH_S)
    evicter = DiskTier(tmp_path, 10_000, IDENTITY)  # finds a's file, already over its budget
    with file_of(tmp_path, key).open("rb") as opened:
        evicter.save(cache_key("b"), snapshot(10, seed=1))  # over its budget with a's file: deletes it
        assert evicter.flush(FLUSH_S)
        assert not file_of(tmp_path, key).exists()
        assert read_snapshot(opened, key, IDENTITY) == snap  # the open file reads whole
    assert reader.load(key, Prefix(snap.tokens)) is None  # and later it is simply a miss
    assert reader.stats()["rejected"] == {}


def test_a_state_mean_comes_back_bit_for_bit_read_only_and_a_damaged_one_is_rejected(tmp_path: Path) -> None:
    mean = (np.arange(16, dtype=np.float32) / 3).astype(np.float32)
    snap = Snapshot(snapshot(10).data, snapshot(10).tokens, mean)
    _, key = written(tmp_path, snap)
    loaded = DiskTier(tmp_path, 1 << 30, IDENTITY).load(key, Prefix(snap.tokens))
    assert loaded is not None and loaded.state_mean is not None
    assert loaded.state_mean.dtype == np.float32 and loaded.state_mean.tobytes() == mean.tobytes()
    assert not loaded.state_mean.flags.writeable
    path = file_of(tmp_path, key)
    data = path.read_bytes()
    path.write_bytes(data[:-5] + bytes([data[-5] ^ 0x01]) + data[-4:])  # inside the mean
    restarted = DiskTier(tmp_path, 1 << 30, IDENTITY)
    assert restarted.load(key, Prefix(snap.tokens)) is None
    assert restarted.stats()["rejected"] == {"checksum": 1}


def test_a_kept_file_is_replaced_only_when_asked(tmp_path: Path) -> None:
    plain = snapshot(10)
    tier, key = written(tmp_path, plain)
    with_mean = Snapshot(plain.data, plain.tokens, np.ones(8, dtype=np.float32))
    tier.save(key, with_mean)
    assert tier.flush(FLUSH_S)
    loaded = tier.load(key, Prefix(plain.tokens))
    assert loaded is not None and loaded.state_mean is None  # written before: kept
    tier.save(key, with_mean, replace=True)
    assert tier.flush(FLUSH_S)
    loaded = tier.load(key, Prefix(plain.tokens))
    assert loaded is not None and loaded.state_mean is not None and loaded.state_mean.tolist() == [1.0] * 8
