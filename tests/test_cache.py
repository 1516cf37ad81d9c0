"""RamTier: LRU order, both bounds, collisions, single flight (pure Python)."""

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

import pytest

from app.engine.caller import Caller, Signal, current, working_for
from app.engine.ram_tier import CacheKey, RamTier, cache_key
from app.engine.snapshot import IMAGE_CELL, ImageSpan, Prefix, Snapshot
from app.errors import Cancelled

T = TypeVar("T")


def snap(n_tokens: int, first: int = 0) -> Snapshot:
    return Snapshot(bytes(10 * n_tokens), tuple(range(first, first + n_tokens)))


def key(name: str) -> CacheKey:
    return cache_key(name)


class Absent(Exception):
    pass


def lookup(cache: RamTier, k: CacheKey, tokens: tuple[int, ...]) -> Snapshot | None:
    """What the cache holds for k and these tokens (a hit also makes it the most recently used)."""

    def absent() -> Snapshot:
        raise Absent

    try:
        return cache.get_or_build(k, Prefix(tokens), absent)[0]
    except Absent:
        return None


def held(cache: RamTier, *entries: tuple[str, Snapshot]) -> list[str]:
    """Which of the named snapshots the cache holds, checked least recently used first."""
    return [name for name, s in entries if lookup(cache, key(name), s.tokens) is s]


def test_key_separates_parts() -> None:
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert cache_key("ab", "c") == cache_key("ab", "c")


def test_a_lookup_returns_what_put_stored_and_counts() -> None:
    cache = RamTier(4, 100)
    s = snap(5)
    assert lookup(cache, key("a"), s.tokens) is None
    assert cache.put(key("a"), s)
    assert lookup(cache, key("a"), s.tokens) is s
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries"], stats["tokens"], stats["bytes"]) == (1, 1, 1, 5, 50)


def test_evicts_least_recently_used_by_entries() -> None:
    cache = RamTier(2, 1000)
    a, b, c = snap(1, 0), snap(1, 1), snap(1, 2)
    cache.put(key("a"), a)
    cache.put(key("b"), b)
    assert lookup(cache, key("a"), a.tokens) is a  # a is now the most recent
    cache.put(key("c"), c)
    assert cache.stats()["evictions"] == 1
    assert held(cache, ("b", b), ("a", a), ("c", c)) == ["a", "c"]


def test_evicts_until_the_token_budget_holds() -> None:
    cache = RamTier(10, 10)
    a, b, c = snap(4, 0), snap(4, 1), snap(6, 2)
    for name, s in (("a", a), ("b", b), ("c", c)):
        cache.put(key(name), s)
    assert cache.stats()["tokens"] == 10
    assert cache.stats()["bytes"] == 100
    assert held(cache, ("a", a), ("b", b), ("c", c)) == ["b", "c"]


def test_an_entry_larger_than_the_budget_is_not_stored() -> None:
    cache = RamTier(10, 10)
    a, big = snap(4), snap(11)
    cache.put(key("a"), a)
    assert not cache.put(key("big"), big)
    assert cache.stats()["oversized"] == 1
    assert held(cache, ("a", a), ("big", big)) == ["a"]


@pytest.mark.parametrize(("entries", "tokens"), [(0, 100), (4, 0), (0, 0)])
def test_either_limit_zero_disables_the_cache(entries: int, tokens: int) -> None:
    cache = RamTier(entries, tokens)
    assert not cache.enabled
    assert not cache.put(key("a"), snap(1))
    built: list[int] = []

    def build() -> Snapshot:
        built.append(1)
        return snap(1)

    first = cache.get_or_build(key("a"), Prefix((0,)), build)
    second = cache.get_or_build(key("a"), Prefix((0,)), build)
    assert (first[1], second[1], len(built), cache.stats()["entries"]) == (False, False, 2, 0)


def test_replacing_a_key_keeps_the_counters_exact() -> None:
    cache = RamTier(4, 100)
    cache.put(key("a"), snap(5))
    cache.put(key("a"), snap(7))
    assert (cache.stats()["entries"], cache.stats()["tokens"], cache.stats()["bytes"]) == (1, 7, 70)


def test_a_hash_collision_is_a_miss_not_a_wrong_snapshot() -> None:
    cache = RamTier(4, 100)
    cache.put(key("same"), snap(3, first=0))
    assert lookup(cache, key("same"), (7, 8, 9)) is None
    assert cache.stats()["collisions"] == 1
    other = snap(3, first=7)
    result, hit = cache.get_or_build(key("same"), Prefix(other.tokens), lambda: other)
    assert (result, hit) == (other, False)
    assert lookup(cache, key("same"), other.tokens) is other


def test_a_prefix_is_known_by_its_cells_and_spans_and_its_files_are_its_own() -> None:
    """The files a prefix carries take no part in a hit (its spans name them by SHA-256), another span
    over the same cells is a collision, and a prefix's files are a copy no caller can change."""
    span, other_span = ImageSpan(1, "ab" * 32, 2, 2), ImageSpan(1, "cd" * 32, 2, 2)
    tokens = (7, IMAGE_CELL, IMAGE_CELL, 8)
    kept = Snapshot(bytes(40), tokens, spans=(span,))
    cache = RamTier(4, 100)
    cache.put(key("image"), kept)
    files = {span.sha256: b"the image file"}
    with_files = Prefix(tokens, (span,), files)
    assert with_files == Prefix(tokens, (span,)) and hash(with_files) == hash(Prefix(tokens, (span,)))
    assert cache.get_or_build(key("image"), with_files, lambda: snap(4)) == (kept, True)
    assert cache.get_or_build(key("image"), Prefix(tokens, (other_span,)), lambda: snap(4))[1] is False
    assert cache.stats()["collisions"] == 1
    files[span.sha256] = b"another file"
    assert with_files.images == {span.sha256: b"the image file"}
    with pytest.raises(TypeError):
        cast(dict[str, bytes], with_files.images)[span.sha256] = b"another file"


def test_evict_drops_an_entry() -> None:
    cache = RamTier(4, 100)
    a = snap(2)
    cache.put(key("a"), a)
    cache.evict(key("a"))
    assert (cache.stats()["dropped"], cache.stats()["tokens"], cache.stats()["entries"]) == (1, 0, 0)
    assert held(cache, ("a", a)) == []


def wait_for_waiting(cache: RamTier, n: int) -> None:
    """Until n requests wait on another's prefill (the follower branch), or fail after 30 s."""
    deadline = time.monotonic() + 30
    while cache.stats()["waiting"] < n:
        assert time.monotonic() < deadline, f"{cache.stats()['waiting']} of {n} followers waiting after 30 s"
        time.sleep(0.001)


class GatedBuild:
    """A build (a prefill, for the RAM tier) that says when it has begun, ends once `release` is set, and
    counts its runs; it builds `result`, or raises RuntimeError with `fails`."""

    def __init__(self, result: Snapshot, fails: bool = False) -> None:
        self.result, self.fails = result, fails
        self.building, self.release = threading.Event(), threading.Event()
        self.runs = 0

    def __call__(self) -> Snapshot:
        self.runs += 1
        self.building.set()
        assert self.release.wait(30)
        if self.fails:
            raise RuntimeError("prefill failed")
        return self.result


def test_concurrent_misses_on_one_key_build_once() -> None:
    cache = RamTier(4, 100)
    n = 8
    build = GatedBuild(snap(3))
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(cache.get_or_build, key("k"), Prefix((0, 1, 2)), build)]
        assert build.building.wait(30)  # one leader is prefilling ...
        futures += [pool.submit(cache.get_or_build, key("k"), Prefix((0, 1, 2)), build) for _ in range(n - 1)]
        wait_for_waiting(cache, n - 1)  # ... and every other request waits on it, none has its own
        build.release.set()
        results = [f.result(timeout=30) for f in futures]
    assert build.runs == 1
    assert sorted(hit for _, hit in results) == [False] + [True] * (n - 1)
    assert len({id(s) for s, _ in results}) == 1


def test_one_follower_builds_when_the_leader_fails_and_the_others_wait_on_it() -> None:
    cache = RamTier(4, 100)
    failing, build = GatedBuild(snap(1), fails=True), GatedBuild(snap(1))
    followers = 3
    with ThreadPoolExecutor(1 + followers) as pool:
        leader = pool.submit(cache.get_or_build, key("k"), Prefix((0,)), failing)
        assert failing.building.wait(30)
        waiting = [pool.submit(cache.get_or_build, key("k"), Prefix((0,)), build) for _ in range(followers)]
        wait_for_waiting(cache, followers)  # the followers wait on the leader's prefill ...
        failing.release.set()  # ... which fails
        with pytest.raises(RuntimeError):
            leader.result(timeout=30)
        assert build.building.wait(30)  # one of them leads now ...
        wait_for_waiting(cache, followers - 1)  # ... and the others wait on it
        build.release.set()
        results = sorted((f.result(timeout=30) for f in waiting), key=lambda found: found[1])
    assert build.runs == 1
    assert [hit for _, hit in results] == [False] + [True] * (followers - 1)
    assert cache.stats()["misses"] == 2  # two leaders, one after the other


def in_thread(caller: Caller, work: Callable[[], T]) -> Callable[[], T]:
    """`work` run for `caller`, in whichever thread runs it."""

    def run() -> T:
        with working_for(caller):
            return work()

    return run


def test_a_follower_leaves_its_wait_once_its_own_caller_is_stopped() -> None:
    cache = RamTier(4, 100)
    build = GatedBuild(snap(3))
    gone = Caller("interactive", Signal())
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(cache.get_or_build, key("k"), Prefix((0, 1, 2)), build)
        assert build.building.wait(30)
        follower = pool.submit(in_thread(gone, lambda: cache.get_or_build(key("k"), Prefix((0, 1, 2)), build)))
        wait_for_waiting(cache, 1)
        gone.stop.set()  # its client went away while the leader still prefills
        with pytest.raises(Cancelled):
            follower.result(timeout=30)
        assert not leader.done() and cache.stats()["waiting"] == 0
        build.release.set()
        assert leader.result(timeout=30)[1] is False


def test_an_interactive_caller_waits_for_a_background_build_of_its_prefix_and_promotes_it() -> None:
    """A fit's prefill of a state would wait behind every interactive step: a request for the same state
    attaches to it and promotes it to the interactive lane, for the rest of that prefill only. The state is
    prefilled once, and the fit's own lane stays background."""
    cache = RamTier(4, 100)
    background_build = GatedBuild(snap(3))
    fit = Caller("background", Signal())
    lanes: list[str] = []

    def fit_prefills() -> tuple[Snapshot, bool]:
        def build() -> Snapshot:
            lanes.append(current().lane)
            found = background_build()
            lanes.append(current().lane)
            return found

        return cache.get_or_build(key("k"), Prefix((0, 1, 2)), build)

    with ThreadPoolExecutor(2) as pool:
        background = pool.submit(in_thread(fit, fit_prefills))
        assert background_build.building.wait(30)
        request = pool.submit(cache.get_or_build, key("k"), Prefix((0, 1, 2)), lambda: snap(4))
        wait_for_waiting(cache, 1)  # the request waits for the fit's prefill: it builds none of its own
        background_build.release.set()
        assert request.result(timeout=30) == (snap(3), True)
        assert background.result(timeout=30) == (snap(3), False)
    assert lanes == ["background", "interactive"]  # promoted once the request waited for it
    assert fit.lane == "background"
    assert cache.stats()["misses"] == 1
