"""Routing by state: the key a proxy hashes so that requests about one state reach one replica.

A replica's prefix cache only pays when the next request about a state reaches the replica
that prefilled it. The key depends on the state alone (not on the model, the questions or
the replica), so every replica and every client computes the same one. It is SHA-256 because
HAProxy computes that too (its `sha2(256)` converter over a body's string `state`,
deploy/haproxy.cfg): a client that echoes the key in a header and one that does not land on
the same replica. Every answer carries it, for clients whose bodies a proxy cannot read
(compressed bodies, states that are objects or arrays).
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Sequence

from app.wire.contract import Text, render_state
from app.wire.images import Image

PREFIX_KEY_HEADER = "X-Onepass-Prefix-Key"  # on every answer; a client may echo it for the proxy to hash
REPLICA_HEADER = "X-Onepass-Replica"  # on every response: which replica answered


def affinity_key(state: Text) -> str:
    """The first 16 hex digits of SHA-256 over the state's UTF-8 text as the prompt and the cache key
    see it: a string without surrounding space, an object or array as canonical JSON (so two equal
    objects in any key order share a key, and so do states that differ only in surrounding space)."""
    return affinity_key_of(render_state(state))


def affinity_key_of(state_text: str, images: Sequence[Image] = ()) -> str:
    """affinity_key of a state already rendered (SystemOneRequest.state_text); with images, over the
    state's text followed by each image's SHA-256 in prompt order, so one image state keeps to one
    replica (a proxy cannot compute this key from the body: clients echo it)."""
    digest = hashlib.sha256(state_text.encode())
    for image in images:
        digest.update(b"\0" + image.sha256.encode())
    return digest.hexdigest()[:16]


def replica_name(configured: str | None, port: int | None = None) -> str:
    """What X-Onepass-Replica says: --replica-name, else the host name, with the port when known
    (unique among replicas on one host)."""
    if configured:
        return configured
    return f"{socket.gethostname()}:{port}" if port is not None else socket.gethostname()
