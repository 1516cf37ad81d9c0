"""A model file's identity: blake3 over every byte, computed once per version of the file.

The disk tier trusts a snapshot only for the exact weights that computed it, and two GGUFs can
share their size and header while their tensors differ (a fine-tune, a re-quantization), so
nothing short of the whole file will do. Hashing a large file takes a while, so the digest is
kept in a small verified record keyed by the file's path, inode, size, mtime and ctime: a file
replaced or rewritten in any way gets a new ctime at least (no user can set it), and is hashed again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import blake3

from app.paths import KEEP_RECORDS, cache_home, prune_records, write_atomically

log = logging.getLogger("onepass.fingerprint")


def records_dir() -> Path:
    return cache_home() / "fingerprints"


def _stat_key(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {
        "path": str(path.resolve()),
        "inode": stat.st_ino,
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
    }


def _check(fields: dict[str, Any]) -> str:
    return blake3.blake3(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _record_path(resolved: str) -> Path:
    return records_dir() / f"{blake3.blake3(resolved.encode()).hexdigest()[:32]}.json"


def hash_file(path: Path) -> bytes:
    """blake3 of the whole file, read through a memory map on every core."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(path)
    return hasher.digest()


def file_digest(path: Path) -> bytes:
    """The file's blake3 digest: from its record while the file is unchanged, else hashed (and recorded)."""
    key = _stat_key(path)
    record = _record_path(key["path"])
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        found = json.loads(record.read_text(encoding="utf-8"))
        fields = {k: v for k, v in found.items() if k != "check"}
        if found["check"] == _check(fields) and {k: fields[k] for k in key} == key:
            os.utime(record)  # used now: the newest in prune_records' order
            return bytes.fromhex(fields["blake3"])
    began = time.perf_counter()
    digest = hash_file(path)
    log.info("hashed %s (%d bytes) in %.2f s", path, key["size"], time.perf_counter() - began)
    if _stat_key(path) == key:  # not written to while we read it
        _write_record(record, {**key, "blake3": digest.hex()})
    return digest


def model_digest(model: Path, mmproj: Path | None = None) -> bytes:
    """A loaded model's identity: its file's digest, and with a vision projector both files' (a
    snapshot of an image is the projector's work too)."""
    digest = file_digest(model)
    if mmproj is None:
        return digest
    return blake3.blake3(b"model+mmproj" + digest + file_digest(mmproj)).digest()


def _write_record(record: Path, fields: dict[str, Any]) -> None:
    """Written whole or not at all (a temporary file renamed over it); a cache that cannot be written
    costs a hash at the next start, nothing more."""
    text = json.dumps({**fields, "check": _check(fields)}, sort_keys=True)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        # Not synced: a record that a power cut loses or empties fails its check and costs one hash.
        write_atomically(record, [text.encode()], durable=False)
        prune_records(record.parent, KEEP_RECORDS)
    except OSError as error:
        log.warning("cannot record the digest of %s in %s: %s", fields["path"], record.parent, error)
