"""A prefix as the engine takes it, and its snapshot: what the engine produces and restores, and what
the prefix cache keeps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

# A cell an image's embedding fills: its entry in a prefix's tokens (llama.cpp's LLAMA_TOKEN_NULL).
IMAGE_CELL = -1


@dataclass(frozen=True)
class ImageSpan:
    """One image's cells in a prefix: the first cell, the file's SHA-256 (hex), how many cells its
    embedding fills and how many positions it advances (fewer with M-RoPE: the larger side of its
    grid)."""

    offset: int
    sha256: str
    n_tokens: int
    n_pos: int

    def entry(self) -> list[int | str]:
        """The span as a disk header holds it."""
        return [self.offset, self.sha256, self.n_tokens, self.n_pos]


def next_position(n_cells: int, spans: Sequence[ImageSpan]) -> int:
    """The position after `n_cells` cells holding `spans`: a text token takes one, an image its n_pos."""
    return n_cells - sum(span.n_tokens - span.n_pos for span in spans)


def spans_fit(tokens: Sequence[int], spans: Sequence[ImageSpan]) -> bool:
    """Whether `spans` lie in order over exactly the image cells of `tokens`."""
    marked = [i for i, token in enumerate(tokens) if token == IMAGE_CELL]
    covered = [i for span in spans for i in range(span.offset, span.offset + span.n_tokens)]
    return marked == covered and all(0 < span.n_pos <= span.n_tokens for span in spans)


def read_spans(entries: Any, tokens: Sequence[int], next_pos: Any) -> tuple[ImageSpan, ...]:
    """The spans a disk header's `entries` describe, checked against its tokens and its next position
    (ValueError says what does not fit)."""
    try:
        spans = tuple(ImageSpan(int(o), str(sha), int(n), int(p)) for o, sha, n, p in entries)
    except (TypeError, ValueError) as error:
        raise ValueError(f"unreadable image spans ({error})") from error
    if not spans_fit(tokens, spans):
        raise ValueError("image spans that do not lie over the image cells")
    if next_position(len(tokens), spans) != next_pos:
        raise ValueError(f"a next position {next_pos!r} that the spans do not give")
    return spans


@dataclass(frozen=True)
class Prefix:
    """A prefix as the engine takes it: its cells (a token each, an image's cells IMAGE_CELL), the spans
    that describe its images among them, in order, and each image's file by its SHA-256, which only a
    prefill or a whole prompt's encode reads. Known by its cells and spans: a span names its file by
    the file's SHA-256, so the files take no part in comparing two prefixes."""

    tokens: tuple[int, ...] = ()
    spans: tuple[ImageSpan, ...] = ()
    images: Mapping[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Tuples, so that a prefix made from lists still equals a snapshot's; the files read-only: one
        # prefix is shared by a plan, the tiers and a prefill, across threads.
        object.__setattr__(self, "tokens", tuple(self.tokens))
        object.__setattr__(self, "spans", tuple(self.spans))
        object.__setattr__(self, "images", MappingProxyType(dict(self.images)))


@dataclass(frozen=True)
class Snapshot:
    """The KV state of sequence 0 after prefilling `tokens` (llama_state_seq_get_data): one cell per
    token, an image's cells marked IMAGE_CELL and described, in prompt order, by `spans`."""

    data: bytes
    tokens: tuple[int, ...]
    # The engine's probe layer's output averaged over the rows this prefill decoded (the state, after
    # the base), where the engine reads that layer: what a state probe fit reads. Both tiers keep it.
    state_mean: NDArray[np.float32] | None = field(default=None, compare=False)
    spans: tuple[ImageSpan, ...] = ()

    @property
    def n_tokens(self) -> int:
        """Cells: text tokens and image embeddings."""
        return len(self.tokens)

    @property
    def next_pos(self) -> int:
        """The position what follows the prefix starts at (the cell count, but where an image
        advances fewer positions than it fills cells)."""
        return next_position(len(self.tokens), self.spans)

    def holds(self, prefix: Prefix) -> bool:
        """Whether this is the snapshot of exactly `prefix`, its cells and spans (a key collision is not)."""
        return self.tokens == prefix.tokens and self.spans == prefix.spans

    @property
    def n_bytes(self) -> int:
        return len(self.data)
