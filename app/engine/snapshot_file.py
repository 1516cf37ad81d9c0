"""A snapshot as a file: its bytes, and the checks a file passes before its snapshot is restored.

A file is MAGIC, the header's length (4 bytes, little-endian), the header (JSON), its blake3, then the
tokens (int32, signed: an image's cells are IMAGE_CELL), the payload (llama.cpp's sequence state) and
the state's mean vector (little-endian float32) where the snapshot has one. The header names what the
bytes are only good for (format, a blake3 of the llama.cpp build, model, KV settings, cache key), the
lengths, the image spans and next position, and a blake3 of the tokens, the payload and the mean. Every
field but the spans has one length whatever the machine: a file's size is the same on every CPU. Reading checks all
of it against this process and the key wanted; a file that fails raises Rejected, by reason. A file
without the mean (an older onepass wrote it) reads as a snapshot without it.
"""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass
from typing import BinaryIO

import blake3
import numpy as np
from numpy.typing import NDArray

from app.engine.ram_tier import CacheKey
from app.engine.snapshot import Snapshot, read_spans

# 2: image spans and the next position in the header; tokens signed (an image's cells are -1).
# 3: the build as its blake3, not its text (which names the CPU's instruction sets, of any length).
FORMAT = 3
MAGIC = b"onepass-snapshot"
DIGEST = 32
MEAN_DTYPE = np.dtype("<f4")  # the state's mean on disk: little-endian float32, whatever the machine


@dataclass(frozen=True)
class SnapshotIdentity:
    """What must match for a snapshot's bytes to be restorable, and exact, in this process."""

    build: str  # llama.cpp's version, system info and GPU layers: they decide the KV values
    model: str  # the model file's fingerprint (hex)
    kv: str  # the KV settings (engine.KvSettings.describe)


class Rejected(Exception):
    """A snapshot file that must not be used; `reason` is its stats bucket."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def file_parts(key: CacheKey, snapshot: Snapshot, identity: SnapshotIdentity) -> tuple[bytes, ...]:
    """The file's bytes for `snapshot` under `key`, in the order they are written."""
    token_bytes = array("i", snapshot.tokens).tobytes()
    mean_bytes = b"" if snapshot.state_mean is None else snapshot.state_mean.astype(MEAN_DTYPE).tobytes()
    header = json.dumps(
        {
            "format": FORMAT,
            "build": _digest(identity.build),
            "model": identity.model,
            "kv": identity.kv,
            "key": key.hex(),
            "n_tokens": snapshot.n_tokens,
            "next_pos": snapshot.next_pos,
            "spans": [span.entry() for span in snapshot.spans],
            "tokens_blake3": blake3.blake3(token_bytes).hexdigest(),
            "payload_bytes": snapshot.n_bytes,
            "payload_blake3": blake3.blake3(snapshot.data, max_threads=blake3.blake3.AUTO).hexdigest(),
            "state_mean_bytes": len(mean_bytes),
            "state_mean_blake3": blake3.blake3(mean_bytes).hexdigest(),
        }
    ).encode()
    head = (MAGIC, len(header).to_bytes(4, "little"), header, blake3.blake3(header).digest())
    return (*head, token_bytes, snapshot.data, mean_bytes)


def read_snapshot(file: BinaryIO, key: CacheKey, identity: SnapshotIdentity) -> Snapshot:
    """The snapshot a file holds, once every check passes; Rejected otherwise."""
    if file.read(len(MAGIC)) != MAGIC:
        raise Rejected("header", "not a onepass snapshot")
    header_bytes = _read_exactly(file, int.from_bytes(_read_exactly(file, 4), "little"))
    if blake3.blake3(header_bytes).digest() != _read_exactly(file, DIGEST):
        raise Rejected("header", "header checksum")
    try:
        header = json.loads(header_bytes)
        n_tokens, n_payload = int(header["n_tokens"]), int(header["payload_bytes"])
        n_mean = int(header.get("state_mean_bytes", 0))  # none in a file an older onepass wrote
        expected = {
            "format": FORMAT,
            "build": _digest(identity.build),
            "model": identity.model,
            "kv": identity.kv,
            "key": key.hex(),
        }
        mismatched = [field for field, value in expected.items() if header[field] != value]
    except (ValueError, KeyError, TypeError) as error:
        raise Rejected("header", f"unparsable header ({error})") from error
    if mismatched:
        raise Rejected(mismatched[0], f"written for another {mismatched[0]}")
    if n_mean % MEAN_DTYPE.itemsize:
        raise Rejected("header", f"a state mean of {n_mean} bytes")
    token_bytes = _read_exactly(file, 4 * n_tokens)
    tokens = tuple(array("i", token_bytes))  # signed: an image's cells are IMAGE_CELL
    payload = _read_exactly(file, n_payload)
    mean_bytes = _read_exactly(file, n_mean)
    if file.read(1):
        raise Rejected("truncated", "longer than its header says")
    if blake3.blake3(token_bytes).hexdigest() != header["tokens_blake3"]:
        raise Rejected("checksum", "tokens checksum")
    if blake3.blake3(payload, max_threads=blake3.blake3.AUTO).hexdigest() != header["payload_blake3"]:
        raise Rejected("checksum", "payload checksum")
    if n_mean and blake3.blake3(mean_bytes).hexdigest() != header.get("state_mean_blake3"):
        raise Rejected("checksum", "state mean checksum")
    try:
        spans = read_spans(header.get("spans"), tokens, header.get("next_pos"))
    except ValueError as error:
        raise Rejected("spans", str(error)) from error
    return Snapshot(payload, tokens, _mean_of(mean_bytes) if n_mean else None, spans)


def _digest(build: str) -> str:
    return blake3.blake3(build.encode()).hexdigest()


def _read_exactly(file: BinaryIO, n: int) -> bytes:
    data = file.read(n)
    if len(data) != n:
        raise Rejected("truncated", f"{len(data)} of {n} bytes")
    return data


def _mean_of(data: bytes) -> NDArray[np.float32]:
    """A state mean read from disk, in the machine's float32, read-only as the engine's are."""
    mean = np.frombuffer(data, dtype=MEAN_DTYPE).astype(np.float32)
    mean.flags.writeable = False
    return mean
