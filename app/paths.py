"""Where onepass's files are: its checkout (when it runs from one) and the per-user cache folder, whose
folders of small records (the tuning's, the model files' digests) keep the most recently used."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

# The folder above the package: the checkout when run from one (models/, deploy/, tests/ are
# there), site-packages when installed (and then none of those exist).
REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = Path(__file__).resolve().parent


def cache_home() -> Path:
    """onepass's per-user cache folder (the wheels, the build check, the tuning, the snapshots)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onepass"


# Records kept in one such folder: each build, model file and thread count gets its own, so a folder
# would grow with every rebuild and every file ever served; the least recently used beyond this are
# deleted, to be measured or hashed again if ever needed.
KEEP_RECORDS = 64


def prune_records(folder: Path, keep: int) -> None:
    """Delete all but the `keep` records (*.json) written or read most recently (a read touches its file)."""
    records = []
    for found in folder.glob("*.json"):
        try:
            records.append((found.stat().st_mtime_ns, found))
        except OSError:  # deleted meanwhile by another process pruning
            continue
    for _, stale in sorted(records, reverse=True)[keep:]:
        with contextlib.suppress(OSError):
            stale.unlink()


def size_of(path: Path) -> int:
    """The file's size; 0 for a file gone (another process deleted it)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def fsync_folder(folder: Path) -> None:
    """Make the folder's entries (a rename into it) survive a power cut."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# What names write_atomically's temporary files, beside their leading "." (a killed writer leaves its own).
TEMP_SUFFIX = ".tmp"


def write_atomically(path: Path, parts: Iterable[bytes], *, durable: bool = True) -> None:
    """Write `parts` to `path` whole or not at all: into a temporary file of its own beside it
    (`.NAME.PID.RANDOM.tmp`), renamed over it. A failure, a part that raises included, removes the
    temporary file and leaves the old file as it was.

    `durable`: on return the bytes and the rename survive a power cut (the file and the folder are
    synced). Without it a process killed at any step still leaves the old file or the new one whole;
    only a power cut may lose the write, or on some filesystems leave an empty file."""
    folder = path.parent  # must exist: a folder gone (a cache deleted under a server) is the caller's to judge
    # Named by process and at random, created exclusively: two writers of one path never share a file,
    # and the mode is a plain new file's (the umask's), as readers in other processes may need it.
    temporary = folder / f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}{TEMP_SUFFIX}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as out:
            for part in parts:
                out.write(part)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    if durable:
        fsync_folder(folder)
