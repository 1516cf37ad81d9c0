"""SnapshotCache: LRU order, both bounds, collisions, single flight (pure Python)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.cache import CacheKey, Snapshot, SnapshotCache, cache_key


def snap(n_tokens: int, first: int = 0) -> Snapshot:
    return Snapshot(bytes(10 * n_tokens), tuple(range(first, first + n_tokens)))


def key(name: str) -> CacheKey:
    return cache_key(name)


def test_key_separates_parts() -> None:
    assert cache_key("ab", "c") != cache_key("a", "bc")
    assert cache_key("ab", "c") == cache_key("ab", "c")


def test_get_returns_what_put_stored_and_counts() -> None:
    cache = SnapshotCache(4, 100)
    s = snap(5)
    assert cache.get(key("a"), s.tokens) is None
    assert cache.put(key("a"), s)
    assert cache.get(key("a"), s.tokens) is s
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries"], stats["tokens"], stats["bytes"]) == (1, 1, 1, 5, 50)


def test_evicts_least_recently_used_by_entries() -> None:
    cache = SnapshotCache(2, 1000)
    a, b, c = snap(1, 0), snap(1, 1), snap(1, 2)
    cache.put(key("a"), a)
    cache.put(key("b"), b)
    assert cache.get(key("a"), a.tokens) is a  # a is now the most recent
    cache.put(key("c"), c)
    assert cache.keys() == [key("a"), key("c")]
    assert cache.stats()["evictions"] == 1


def test_evicts_until_the_token_budget_holds() -> None:
    cache = SnapshotCache(10, 10)
    cache.put(key("a"), snap(4))
    cache.put(key("b"), snap(4))
    cache.put(key("c"), snap(6))
    assert cache.keys() == [key("b"), key("c")]
    assert cache.stats()["tokens"] == 10
    assert cache.stats()["bytes"] == 100


def test_an_entry_larger_than_the_budget_is_not_stored() -> None:
    cache = SnapshotCache(10, 10)
    cache.put(key("a"), snap(4))
    assert not cache.put(key("big"), snap(11))
    assert cache.keys() == [key("a")]
    assert cache.stats()["oversized"] == 1


@pytest.mark.parametrize(("entries", "tokens"), [(0, 100), (4, 0), (0, 0)])
def test_either_limit_zero_disables_the_cache(entries: int, tokens: int) -> None:
    cache = SnapshotCache(entries, tokens)
    assert not cache.enabled
    assert not cache.put(key("a"), snap(1))
    built: list[int] = []

    def build() -> Snapshot:
        built.append(1)
        return snap(1)

    first = cache.get_or_build(key("a"), (0,), build)
    second = cache.get_or_build(key("a"), (0,), build)
    assert (first[1], second[1], len(built), cache.stats()["entries"]) == (False, False, 2, 0)


def test_replacing_a_key_keeps_the_counters_exact() -> None:
    cache = SnapshotCache(4, 100)
    cache.put(key("a"), snap(5))
    cache.put(key("a"), snap(7))
    assert (cache.stats()["entries"], cache.stats()["tokens"], cache.stats()["bytes"]) == (1, 7, 70)


def test_a_hash_collision_is_a_miss_not_a_wrong_snapshot() -> None:
    cache = SnapshotCache(4, 100)
    cache.put(key("same"), snap(3, first=0))
    assert cache.get(key("same"), (7, 8, 9)) is None
    assert cache.stats()["collisions"] == 1
    other = snap(3, first=7)
    result, hit = cache.get_or_build(key("same"), other.tokens, lambda: other)
    assert (result, hit) == (other, False)
    assert cache.get(key("same"), other.tokens) is other


def test_evict_drops_an_entry() -> None:
    cache = SnapshotCache(4, 100)
    cache.put(key("a"), snap(2))
    cache.evict(key("a"))
    assert cache.keys() == []
    assert (cache.stats()["dropped"], cache.stats()["tokens"]) == (1, 0)


def test_concurrent_misses_on_one_key_build_once() -> None:
    cache = SnapshotCache(4, 100)
    n = 8
    everyone_asked = threading.Barrier(n + 1)
    release = threading.Event()
    builds = []

    def build() -> Snapshot:
        builds.append(1)
        release.wait()
        return snap(3)

    def request() -> tuple[Snapshot, bool]:
        everyone_asked.wait()
        return cache.get_or_build(key("k"), (0, 1, 2), build)

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(request) for _ in range(n)]
        everyone_asked.wait()
        release.set()
        results = [f.result() for f in futures]
    assert len(builds) == 1
    assert sorted(hit for _, hit in results) == [False] + [True] * (n - 1)
    assert len({id(s) for s, _ in results}) == 1


def test_followers_build_themselves_when_the_leader_fails() -> None:
    cache = SnapshotCache(4, 100)
    leader_started, release = threading.Event(), threading.Event()

    def failing() -> Snapshot:
        leader_started.set()
        release.wait()
        raise RuntimeError("prefill failed")

    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(cache.get_or_build, key("k"), (0,), failing)
        leader_started.wait()
        follower = pool.submit(cache.get_or_build, key("k"), (0,), lambda: snap(1))
        release.set()
        with pytest.raises(RuntimeError):
            leader.result()
        assert follower.result()[0] == snap(1)
