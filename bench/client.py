"""The bench's client side: states of a given size, and one timed System One request."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx

from app.engine.engine import Engine


def sized_text(engine: Engine, sentences: Sequence[str], tokens: int, tag: object, start: int = 0) -> str:
    """Sentences from `start` on, each stamped with `tag` and its index, until `tokens` tokens."""
    text, i = "", 0
    while len(engine.vocab.tokenize(text, special=False)) < tokens:
        text += sentences[(start + i) % len(sentences)].format(n=f"{tag}-{i}") + " "
        i += 1
    return text.strip()


def ask(client: httpx.Client, url: str, state: str, questions: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(milliseconds from the client, the response body)."""
    body = {"model": "jev-latest", "state": state, "questions": questions}
    began = time.perf_counter()
    response = client.post(url + "/v1/systemone", json=body, timeout=900)
    elapsed = (time.perf_counter() - began) * 1000
    response.raise_for_status()
    return elapsed, response.json()
