"""One PNG figure for the bench reports, drawn headless."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.output import write_atomically


@contextmanager
def figure(path: Path, size: tuple[float, float]) -> Iterator[Any]:
    """Yields the axes; on exit adds the legend and writes the PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        write_atomically(path, png.getvalue())
    finally:
        plt.close(fig)
