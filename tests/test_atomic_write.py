"""write_atomically, the one writer of every file onepass replaces whole (labels, fits, evidence, digest
records, snapshots): the file is the old one or the new one, never a part, and no temporary file outlives
a failure."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.disk_tier import STALE_TEMP_SECONDS, DiskTier
from app.engine.snapshot_file import SnapshotIdentity
from app.paths import REPO_ROOT, TEMP_SUFFIX, write_atomically


def test_the_parts_replace_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"old")
    write_atomically(path, [b"new ", b"", b"parts"])
    assert path.read_bytes() == b"new parts"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_part_that_raises_midway_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"old")

    def parts() -> Iterator[bytes]:
        yield b"x" * 100_000  # past the write buffer: some bytes are already in the temporary file
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, parts())
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_failed_first_write_leaves_no_file_at_all(tmp_path: Path) -> None:
    def parts() -> Iterator[bytes]:
        yield b"half"
        raise KeyboardInterrupt  # not only errors: any way out removes the temporary file

    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "f.json", parts())
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_is_an_error_not_created(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "gone" / "f.json", [b"x"])
    assert list(tmp_path.iterdir()) == []


def test_the_new_file_has_a_plain_new_files_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_atomically(tmp_path / "f.json", [b"x"])
    finally:
        os.umask(umask)
    assert (tmp_path / "f.json").stat().st_mode & 0o777 == 0o644  # readable by other users, as open() makes it


@pytest.mark.parametrize("durable", [True, False])
def test_durable_syncs_the_file_and_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool) -> None:
    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(descriptor: int) -> None:
        synced.append("folder" if os.path.samestat(os.fstat(descriptor), tmp_path.stat()) else "file")
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    write_atomically(tmp_path / "f.json", [b"x"], durable=durable)
    assert synced == (["file", "folder"] if durable else [])


def killed_midway(path: Path) -> None:
    """Run write_atomically in a process killed between two parts: what a kill -9 leaves behind."""
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from app.paths import write_atomically\n"
        "def parts():\n"
        "    yield b'half'\n"
        "    os._exit(9)\n"
        "write_atomically(Path(sys.argv[1]), parts())\n"
    )
    killed = subprocess.run([sys.executable, "-c", code, str(path)], cwd=REPO_ROOT, timeout=60)
    assert killed.returncode == 9


def test_the_disk_tier_clears_what_a_killed_writer_left_once_it_is_stale(tmp_path: Path) -> None:
    killed_midway(tmp_path / "stale.snap")
    killed_midway(tmp_path / "recent.snap")
    stale, recent = (next(tmp_path.glob(f".{name}.snap.*{TEMP_SUFFIX}")) for name in ("stale", "recent"))
    past = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(stale, (past, past))
    tier = DiskTier(tmp_path, 1 << 30, SnapshotIdentity(build="b", model="m", kv="k"))
    try:
        assert not stale.exists()  # its writer is long dead
        assert recent.exists()  # it may be another process's write in progress
        assert tier.stats()["entries"] == 0  # neither is taken for a snapshot
    finally:
        tier.close()
