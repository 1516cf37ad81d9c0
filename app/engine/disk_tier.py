"""DiskTier: prefix snapshots on disk under the RAM cache, so a restart keeps them.

One file per snapshot, `<key hex>.snap`, in a folder per model. A new snapshot is queued and
written by a background thread (temporary file, fsync, rename), so a request never waits for
the disk; when the queue holds too many bytes the write is skipped and counted. Every read checks the
whole file against this process (snapshot_file.py: the format and its checks) and compares tokens and
image spans (never pixels) with the wanted prefix: a file that fails is deleted, counted by reason and
the request prefills as a miss.

Several processes may share the folder, so any file may vanish between two steps: a reader
only ever opens whole files (rename is atomic), two writers of one key each rename a whole
file of the same content, and a file deleted while another process reads it stays readable
to that reader (POSIX unlink). The byte budget is enforced by the process that writes, over
every file in the folder, least recently used first (a hit touches the file's mtime, so the
order survives restarts).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import secrets
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from app.engine.ram_tier import CacheKey
from app.engine.snapshot import Prefix, Snapshot
from app.engine.snapshot_file import Rejected, SnapshotIdentity, file_parts, read_snapshot
from app.paths import TEMP_SUFFIX, size_of, write_atomically

log = logging.getLogger("onepass.disk")

SUFFIX = ".snap"
# Bytes of snapshots waiting to be written (a few long ones, or many priors); beyond, writes are
# skipped, never waited for. One write is always let in, whatever its size.
WRITE_QUEUE_BYTES = 256 * 1024**2
STALE_TEMP_SECONDS = 3600  # a temporary file this old was left by a killed writer

# What stats() counts beside sizes, rejections and turn-offs.
COUNTS = ("hits", "misses", "evictions", "collisions", "writes", "writes_skipped", "oversized", "read_bytes")


class DiskTier:
    def __init__(
        self, folder: Path, max_bytes: int, identity: SnapshotIdentity, queue_bytes: int = WRITE_QUEUE_BYTES
    ) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.identity = identity
        self._lock = threading.Lock()
        self._sizes: dict[str, int] = {}  # file name -> bytes, for the files this process knows of
        self._counts: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._turned_off: Counter[str] = Counter()  # by errno name
        self._read_seconds = 0.0  # spent reading and verifying the files of hits
        self._queue: queue.Queue[tuple[CacheKey, Snapshot, bool] | None] = queue.Queue()  # bounded by queue_bytes
        self._queue_bytes = queue_bytes
        self._idle = threading.Condition()
        self._pending = 0  # writes queued or in progress
        self._pending_bytes = 0
        self._writer: threading.Thread | None = None
        self.enabled = max_bytes > 0 and self._open()
        if self.enabled:
            self._writer = threading.Thread(target=self._write_queued, name="onepass-disk-writer", daemon=True)
            self._writer.start()

    def _open(self) -> bool:
        """Create the folder, prove it writable, clear dead temporary files, index the snapshots."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = self.folder / f".probe.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
            probe.write_bytes(b"")  # root ignores permission bits: only a real write proves it
            probe.unlink()
            now = time.time()
            for path in self.folder.glob(f".*{TEMP_SUFFIX}"):
                with contextlib.suppress(FileNotFoundError):
                    if now - path.stat().st_mtime > STALE_TEMP_SECONDS:
                        path.unlink()
            files = self._scan()
        except OSError as error:
            log.warning("snapshot disk tier off: %s is not usable (%s); serving from RAM only", self.folder, error)
            return False
        self._sizes = {name: size for name, size, _ in files}
        log.info(
            "snapshot disk tier %s: %d files (snapshots and calibration priors), %d bytes (budget %d)",
            self.folder,
            len(files),
            sum(self._sizes.values()),
            self.max_bytes,
        )
        return True

    def _scan(self) -> list[tuple[str, int, float]]:
        """(name, bytes, last use) of every snapshot file in the folder, least recently used first."""
        files = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(SUFFIX) and not entry.name.startswith("."):
                with contextlib.suppress(FileNotFoundError):
                    info = entry.stat()
                    files.append((entry.name, info.st_size, info.st_mtime))
        return sorted(files, key=lambda file: file[2])

    def _path(self, key: CacheKey) -> Path:
        return self.folder / f"{key.hex()}{SUFFIX}"

    # Reading

    def load(self, key: CacheKey, prefix: Prefix) -> Snapshot | None:
        """The snapshot stored for `key` if its file is whole, verified and of `prefix`, its tokens and images."""
        if not self.enabled:
            return None
        path = self._path(key)
        began = time.perf_counter()
        snapshot: Snapshot | None = None
        try:
            with path.open("rb") as file:
                snapshot = read_snapshot(file, key, self.identity)
        except FileNotFoundError:
            with self._lock:
                self._sizes.pop(path.name, None)
        except Rejected as rejected:
            self._reject(path, rejected)
        except OSError as error:
            self._reject(path, Rejected("unreadable", str(error)))
        if snapshot is not None and not snapshot.holds(prefix):
            self._count("collisions")  # a key collision: the file is sound, just not this prefix
            snapshot = None
        if snapshot is None:
            self._count("misses")
            return None
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)  # its last use, for the LRU order that outlives this process
        with self._lock:
            self._sizes[path.name] = self._sizes.get(path.name) or size_of(path)
            self._counts["hits"] += 1
            self._counts["read_bytes"] += snapshot.n_bytes
            self._read_seconds += time.perf_counter() - began
        return snapshot

    def _reject(self, path: Path, rejected: Rejected) -> None:
        with contextlib.suppress(OSError):  # gone already, or not deletable: it is a miss either way
            path.unlink()
        with self._lock:
            self._sizes.pop(path.name, None)
            self._rejected[rejected.reason] += 1
            first = self._rejected[rejected.reason] == 1
        # One warning per reason; a folder of stale files (say after an upgrade) logs once.
        log.log(logging.WARNING if first else logging.DEBUG, "deleted snapshot file %s (%s)", path.name, rejected)

    def discard(self, key: CacheKey) -> None:
        """Delete a snapshot that llama.cpp refused to restore."""
        if self.enabled:
            self._reject(self._path(key), Rejected("restore"))

    def forget(self, key: CacheKey) -> None:
        """Delete a good snapshot on purpose (its state is to be answered as new): no rejection."""
        if self.enabled:
            with contextlib.suppress(OSError):
                self._path(key).unlink()
            with self._lock:
                self._sizes.pop(self._path(key).name, None)

    # Writing

    def save(self, key: CacheKey, snapshot: Snapshot, *, replace: bool = False) -> None:
        """Queue `snapshot` for writing; never blocks. A full queue skips the write (counted). A file
        already there for `key` is kept, unless `replace` (it lacked the state's mean)."""
        if not self.enabled:
            return
        with self._idle:
            if self._pending and self._pending_bytes + snapshot.n_bytes > self._queue_bytes:
                with self._lock:
                    self._counts["writes_skipped"] += 1
                return
            self._pending += 1
            self._pending_bytes += snapshot.n_bytes
            self._queue.put_nowait((key, snapshot, replace))

    def flush(self, timeout: float) -> bool:
        """Wait until every queued write is done (or skipped); False if `timeout` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Finish the queued writes (up to `timeout`), then stop the writer."""
        if self._writer is None:
            return
        self.flush(timeout)
        self._queue.put(None)
        self._writer.join(timeout)
        self._writer = None

    def _write_queued(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                if self.enabled:
                    self._write(*item)
                else:
                    self._count("writes_skipped")
            except OSError as error:
                self._turn_off(error)
            except Exception:  # a bug must not kill the writer and leave flush() waiting
                log.exception("writing a snapshot failed")
            finally:
                with self._idle:
                    self._pending -= 1
                    self._pending_bytes -= item[1].n_bytes
                    self._idle.notify_all()

    def _write(self, key: CacheKey, snapshot: Snapshot, replace: bool) -> None:
        path = self._path(key)
        if path.exists() and not replace:
            return  # written before, by this process or another
        parts = file_parts(key, snapshot, self.identity)
        if sum(map(len, parts)) > self.max_bytes:
            self._count("oversized")  # writing it would evict every other file and then itself
            return
        # Synced, file and folder: a snapshot file is trusted after a power cut. The temporary file's name
        # is its writer's own, so two writers of one key never write into one file.
        write_atomically(path, parts)
        size = size_of(path)
        with self._lock:
            self._sizes[path.name] = size
            self._counts["writes"] += 1
            over = sum(self._sizes.values()) > self.max_bytes
        if over:
            self._evict()

    def _evict(self) -> None:
        """Delete the least recently used files of the whole folder (other processes' too) until
        the budget holds."""
        files = self._scan()
        excess = sum(size for _, size, _ in files) - self.max_bytes
        kept, evicted = {}, 0
        for name, size, _ in files:
            if excess <= 0:
                kept[name] = size
                continue
            excess -= size
            with contextlib.suppress(FileNotFoundError):  # another process evicted it first
                (self.folder / name).unlink()
                evicted += 1
        with self._lock:
            self._sizes = kept
            self._counts["evictions"] += evicted

    def _turn_off(self, error: OSError) -> None:
        reason = errno.errorcode.get(error.errno or 0, "error")
        log.warning(
            "snapshot disk tier off: writing to %s failed (%s: %s); serving from RAM only", self.folder, reason, error
        )
        with self._lock:
            self.enabled = False
            self._turned_off[reason] += 1

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "enabled": self.enabled,
                "dir": str(self.folder),
                "entries": len(self._sizes),
                "bytes": sum(self._sizes.values()),
                "max_bytes": self.max_bytes,
                **{name: self._counts[name] for name in COUNTS},
                "read_seconds": round(self._read_seconds, 6),
                "queued": self._pending,  # writes queued or being written
                "rejected": dict(self._rejected),
                "turned_off": dict(self._turned_off),
            }
