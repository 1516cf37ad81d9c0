"""The tokens a prompter keeps: a text that cannot fit in the model's context is refused before it is
tokenized (prompter.py's ContextBound), and only the tokens of texts that fit are kept, compactly.

A prompter tokenizes its state (and a decision model its whole prompt) on every request; keeping the
tokens of recent texts spares a repeated state that work. Keys are digests, not the texts, and tokens
are kept as C ints (array('i')), so what the memo holds is bounded by its entries times the
context, whatever the requests sent.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from app.answering.prompter import ContextBound


class TokenMemo:
    """The tokens of the last `entries` texts (or keys made of texts) whose tokens fit the context; a
    text whose tokens do not fit is tokenized again if it comes again, never kept."""

    def __init__(self, entries: int, bound: ContextBound | None = None) -> None:
        self.entries, self.bound = entries, bound
        self._kept: OrderedDict[tuple[Hashable, ...], array[int]] = OrderedDict()
        self._lock = threading.Lock()  # prompters plan in several worker threads at once

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: tuple[Hashable, ...], tokenize: Callable[[], Sequence[int]]) -> tuple[int, ...]:
        """The tokens `tokenize` gives for `key` (whose texts are kept as digests), kept if they fit."""
        digest = tuple(_digest(part) if isinstance(part, str) else part for part in key)
        with self._lock:
            kept = self._kept.get(digest)
            if kept is not None:
                self._kept.move_to_end(digest)
                return tuple(kept)
        tokens = tokenize()
        if self.entries > 0 and (self.bound is None or self.bound.holds(tokens)):
            with self._lock:
                self._kept[digest] = array("i", tokens)
                self._kept.move_to_end(digest)
                while len(self._kept) > self.entries:
                    self._kept.popitem(last=False)
        return tuple(tokens)

    def text(self, text: str, tokenize: Callable[[str], Sequence[int]]) -> tuple[int, ...]:
        """The tokens of `text`, refused (TooLongForContext) before tokenizing where it cannot fit."""
        if self.bound is not None:
            self.bound.check(text)
        return self.get((text,), lambda: tokenize(text))


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=32).digest()
