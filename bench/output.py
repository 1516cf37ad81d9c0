"""Results files written atomically: a crash or a full disk leaves the old file or none, never half."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: str | bytes) -> None:
    partial = path.with_name(path.name + ".tmp")  # git-ignored: bench/results/*.tmp
    with partial.open("wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    partial.replace(path)
