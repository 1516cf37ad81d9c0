"""Where onepass's files are: its checkout (when it runs from one) and the per-user cache folder, whose
folders of small records (the tuning's, the model files' digests) keep the most recently used."""

from __future__ import annotations

import contextlib
import os
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
