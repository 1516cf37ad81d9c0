"""Where onepass's files are: its checkout (when it runs from one) and the per-user cache folder."""

from __future__ import annotations

import os
from pathlib import Path

# The folder above the package: the checkout when run from one (models/, deploy/, tests/ are
# there), site-packages when installed (and then none of those exist).
REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = Path(__file__).resolve().parent


def cache_home() -> Path:
    """onepass's per-user cache folder (the wheels, the build check, the tuning, the snapshots)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "onepass"
