"""make bench-fleet: prefix-cache hit rate and prefill saved against fleet size, per routing policy.

No model runs. Each replica is the real RamTier at the default size (16 snapshots, 32,768
tokens), holding snapshots of each state's token count. Requests arrive as a Poisson stream and
ask about states of Zipf-like popularity; a replica answers one request at a time (contexts = 1),
in arrival order: a hit costs the decode, a miss the state's prefill too (the default model's
rates on 2 cores, docs/performance.md). The policies pick a replica per request as HAProxy 2.6 does:

- round robin;
- least connections: fewest requests in flight, ties in turn;
- consistent hashing with bounded load (deploy/haproxy.cfg): the ring of lb_chash.c (16 points per
  unit of weight, at full_hash(puid * 4096 + i)), the key's sdbm hash with avalanche, the closest
  point, then onwards past every replica holding its share of hash-balance-factor or more;
- the same hashing without the bound (hash-balance-factor 0), to show what the bound costs and buys.

The first quarter of the requests warms the caches and is not counted.

    python -m bench.fleet_sim [--requests N] [--states N] [--zipf S] [--replicas 1,2,4] [--out DIR]
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import itertools
import json
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.config import Settings
from app.engine.ram_tier import CacheKey, RamTier
from app.engine.snapshot import Prefix, Snapshot
from app.fleet.routing import affinity_key
from bench.figure import figure
from bench.output import Progress, write_atomically

RESULTS = Path(__file__).parent / "results"
MASK = 0xFFFFFFFF
POINTS_PER_WEIGHT = 16  # BE_WEIGHT_SCALE: a server of weight w has 16 * w points on the ring
PUID_SPACING = 4096  # SRV_EWGHT_RANGE: point i of server id p sits at full_hash(p * 4096 + i)
BALANCE_FACTOR = 150  # deploy/haproxy.cfg's hash-balance-factor
DECODE_MS = 450.0  # one question's suffix decode on a hit, default model, 2 cores
PREFILL_MS_PER_TOKEN = 10.0  # the default model prefills about 100 tokens/s on 2 cores
LENGTH_STEPS = 8
POLICIES = ("round robin", "least connections", "bounded-load hashing", "hashing, no bound")
SHORT = {
    "round robin": "RR",
    "least connections": "LC",
    "bounded-load hashing": "hash",
    "hashing, no bound": "no bound",
}


def full_hash(a: int) -> int:
    """HAProxy's full_hash (Bob Jenkins' 32-bit integer avalanche, then a multiply)."""
    a = (a + 0x7ED55D16 + (a << 12)) & MASK
    a = (a ^ 0xC761C23C ^ (a >> 19)) & MASK
    a = (a + 0x165667B1 + (a << 5)) & MASK
    a = ((a + 0xD3A2646C) ^ (a << 9)) & MASK
    a = (a + 0xFD7046C5 + (a << 3)) & MASK
    a = (a ^ 0xB55A4F09 ^ (a >> 16)) & MASK
    return (a * 3221225473) & MASK


def sdbm(data: bytes) -> int:
    value = 0
    for byte in data:
        value = (byte + (value << 6) + (value << 16) - value) & MASK
    return value


def key_hash(key: str) -> int:
    """What `balance hash` with `hash-type consistent sdbm avalanche` makes of a routing key."""
    return full_hash(sdbm(key.encode()))


def slots(served: int, replicas: int, index: int, factor: int = BALANCE_FACTOR, weight: int = 1) -> int:
    """How many requests replica `index` (0-based, config order, all of one weight) may hold in flight
    before the next one passes it by, with `served` in flight over the backend (chash_server_is_eligible)."""
    eweight = weight * POINTS_PER_WEIGHT
    total_weight = eweight * replicas
    cumulative = eweight * index
    total_slots = ((served + 1) * factor + 99) // 100
    per_weight, remainder = divmod(total_slots, total_weight)
    share = eweight * per_weight
    share += (cumulative + eweight) * remainder // total_weight - cumulative * remainder // total_weight
    return max(share, 1)


class Ring:
    """The consistent-hash ring of HAProxy 2.6 for `replicas` servers of one weight, ids 1..N in order."""

    def __init__(self, replicas: int, weight: int = 1) -> None:
        points = sorted(
            (full_hash(puid * PUID_SPACING + i), puid - 1)
            for puid in range(1, replicas + 1)
            for i in range(weight * POINTS_PER_WEIGHT)
        )
        self.keys = [key for key, _ in points]
        self.owners = [owner for _, owner in points]
        self.replicas, self.weight = replicas, weight

    def pick(self, hashed: int, in_flight: Sequence[int] | None = None, factor: int = BALANCE_FACTOR) -> int:
        """The replica for a hashed key: the closest point's, then (with `in_flight` per replica)
        onwards along the ring past every replica at its bound (chash_get_server_hash)."""
        count = len(self.keys)
        after = bisect.bisect_left(self.keys, hashed) % count
        before = (after - 1) % count
        at = before if (hashed - self.keys[before]) & MASK <= (self.keys[after] - hashed) & MASK else after
        if in_flight is None:
            return self.owners[at]
        served = sum(in_flight)
        for step in range(2 * count):  # HAProxy gives up after wrapping around twice
            owner = self.owners[(at + step) % count]
            if in_flight[owner] < slots(served, self.replicas, owner, factor, self.weight):
                return owner
        return self.owners[at]


@dataclass(frozen=True)
class Workload:
    requests: int = 30_000
    states: int = 4_000
    zipf: float = 1.0  # popularity of the k-th most asked state ~ 1 / k^zipf
    min_tokens: int = 64
    max_tokens: int = 4096  # state lengths: 8 log-spaced steps in between, each once in every 8 states by rank
    load: float = 0.5  # arrival rate over what the fleet could answer if every request missed
    warmup: float = 0.25  # share of the requests not counted
    seed: int = 18


@dataclass
class Outcome:
    policy: str
    replicas: int
    hit_rate: float
    prefill_saved: float  # share of the state tokens that did not need a prefill
    mean_ms: float
    p99_ms: float
    busiest: float  # the busiest replica's requests over the average
    extra: dict[str, Any] = field(default_factory=dict)


class States:
    """The states asked about: routing key, its hash on the ring, token count. Their snapshots are
    stand-ins: the token count is real, the bytes are not (the cache is bounded by entries and
    tokens, never by bytes)."""

    def __init__(self, workload: Workload) -> None:
        rng = random.Random(workload.seed)
        self.keys = [affinity_key(f"state {i}") for i in range(workload.states)]
        self.hashes = [key_hash(key) for key in self.keys]
        self.weights = [1 / (k + 1) ** workload.zipf for k in range(workload.states)]  # popularity
        # Every length is asked about about as often as every other: from the most asked state down, each
        # state takes the length with the least popularity so far. (Independent draws would let the
        # lengths of the few hottest states, hits on any replica, decide how many tokens are saved.)
        ratio = (workload.max_tokens / workload.min_tokens) ** (1 / (LENGTH_STEPS - 1))
        steps = [round(workload.min_tokens * ratio**i) for i in rng.sample(range(LENGTH_STEPS), LENGTH_STEPS)]
        carried = dict.fromkeys(steps, 0.0)
        self.lengths = []
        for weight in self.weights:
            length = min(steps, key=carried.__getitem__)
            carried[length] += weight
            self.lengths.append(length)
        self._tokens = {n: tuple(range(n)) for n in set(self.lengths)}

    def ask(self, cache: RamTier, state: int) -> bool:
        """Whether the cache held the state's snapshot; if not, it holds it now (what a miss does)."""
        snapshot = Snapshot(b"", self._tokens[self.lengths[state]])
        _, hit = cache.get_or_build(CacheKey(self.keys[state].encode()), Prefix(snapshot.tokens), lambda: snapshot)
        return hit


def make_stream(workload: Workload, states: States, mean_miss_ms: float, replicas: int) -> list[tuple[float, int]]:
    """(arrival ms, state) per request: the same states in the same order for every policy at one size."""
    rng = random.Random(workload.seed + replicas)
    cumulative = list(itertools.accumulate(states.weights))
    chosen = rng.choices(range(workload.states), cum_weights=cumulative, k=workload.requests)
    rate = workload.load * replicas / mean_miss_ms  # requests per ms
    arrivals = itertools.accumulate(rng.expovariate(rate) for _ in chosen)
    return list(zip(arrivals, chosen, strict=True))


def simulate(policy: str, replicas: int, workload: Workload, states: States, settings: Settings) -> Outcome:
    caches = [RamTier(settings.session_cache_entries, settings.session_cache_tokens) for _ in range(replicas)]
    lengths = states.lengths
    stream = make_stream(workload, states, DECODE_MS + PREFILL_MS_PER_TOKEN * statistics.fmean(lengths), replicas)
    choose = chooser(policy, replicas, states)
    in_flight = [0] * replicas  # what the proxy sees: requests sent to a replica and not yet answered
    finishing: list[tuple[float, int]] = []  # (when, replica), soonest first
    free_at = [0.0] * replicas
    counted_from = int(len(stream) * workload.warmup)
    hits = saved = asked = 0
    latencies: list[float] = []
    per_replica = [0] * replicas
    for n, (arrival, state) in enumerate(stream):
        while finishing and finishing[0][0] <= arrival:
            in_flight[heapq.heappop(finishing)[1]] -= 1
        replica = choose(state, in_flight)
        hit = states.ask(caches[replica], state)
        start = max(arrival, free_at[replica])  # one request at a time, in arrival order
        free_at[replica] = start + DECODE_MS + (0.0 if hit else PREFILL_MS_PER_TOKEN * lengths[state])
        in_flight[replica] += 1
        heapq.heappush(finishing, (free_at[replica], replica))
        if n >= counted_from:
            hits += hit
            saved, asked = saved + (lengths[state] if hit else 0), asked + lengths[state]
            latencies.append(free_at[replica] - arrival)
            per_replica[replica] += 1
    latencies.sort()
    return Outcome(
        policy,
        replicas,
        hit_rate=hits / len(latencies),
        prefill_saved=saved / asked,
        mean_ms=statistics.fmean(latencies),
        p99_ms=latencies[int(0.99 * (len(latencies) - 1))],
        busiest=max(per_replica) / (sum(per_replica) / replicas),
    )


def pooled(replicas: int, workload: Workload, states: States, settings: Settings) -> float:
    """The hit rate of one cache as large as the whole fleet's (a bar no routing is likely to pass)."""
    cache = RamTier(settings.session_cache_entries * replicas, settings.session_cache_tokens * replicas)
    stream = make_stream(workload, states, 1.0, replicas)
    counted_from = int(len(stream) * workload.warmup)
    hits = [states.ask(cache, state) for _, state in stream]
    return sum(hits[counted_from:]) / (len(stream) - counted_from)


def chooser(policy: str, replicas: int, states: States) -> Callable[[int, list[int]], int]:
    """policy -> choose(state, requests in flight per replica) -> replica index."""
    turn = itertools.count()
    if policy == "round robin":
        return lambda state, in_flight: next(turn) % replicas
    if policy == "least connections":

        def least(state: int, in_flight: list[int]) -> int:
            first = next(turn)
            return min(range(replicas), key=lambda i: (in_flight[i], (i - first) % replicas))

        return least
    ring = Ring(replicas)
    if policy == "bounded-load hashing":
        return lambda state, in_flight: ring.pick(states.hashes[state], in_flight)
    if policy == "hashing, no bound":
        return lambda state, in_flight: ring.pick(states.hashes[state])
    raise ValueError(f"unknown policy {policy!r}")


def run(workload: Workload, fleet_sizes: Sequence[int], show_progress: bool = True) -> dict[str, Any]:
    settings = Settings()  # the default cache size per replica
    states = States(workload)
    outcomes: list[Outcome] = []
    bars = Progress(len(fleet_sizes) * len(POLICIES), "fleet simulation") if show_progress else None
    for replicas in fleet_sizes:
        bound = pooled(replicas, workload, states, settings)
        for policy in POLICIES:
            outcome = simulate(policy, replicas, workload, states, settings)
            outcome.extra["pooled_hit_rate"] = bound
            outcomes.append(outcome)
            if bars is not None:
                bars.step(f"{policy}, {replicas} replicas")
    return {
        "workload": asdict(workload),
        "cache_per_replica": {"entries": settings.session_cache_entries, "tokens": settings.session_cache_tokens},
        "service_ms": {"decode": DECODE_MS, "prefill_per_token": PREFILL_MS_PER_TOKEN},
        "balance_factor": BALANCE_FACTOR,
        "outcomes": [asdict(outcome) for outcome in outcomes],
    }


def by_size(report: dict[str, Any]) -> dict[int, dict[str, dict[str, Any]]]:
    rows: dict[int, dict[str, dict[str, Any]]] = {}
    for outcome in report["outcomes"]:
        rows.setdefault(outcome["replicas"], {})[outcome["policy"]] = outcome
    return dict(sorted(rows.items()))


Row = dict[str, dict[str, Any]]  # one fleet size: policy -> outcome


def markdown(report: dict[str, Any], columns: Sequence[tuple[str, Callable[[Row], str]]]) -> str:
    lines = ["| replicas | " + " | ".join(heading for heading, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for replicas, row in by_size(report).items():
        lines.append(f"| {replicas} | " + " | ".join(cell(row) for _, cell in columns) + " |")
    return "\n".join(lines) + "\n"


def table(report: dict[str, Any]) -> str:
    """Two Markdown tables (docs/fleet.md's): what the caches saved, and how long clients waited."""

    def share(policy: str, name: str) -> Callable[[Row], str]:
        return lambda row: f"{row[policy][name]:.1%}"

    def seconds(policy: str) -> Callable[[Row], str]:
        return lambda row: f"{row[policy]['mean_ms'] / 1000:.1f}"

    rr, lc, bounded, unbounded = POLICIES
    saved = [
        ("hit rate: round robin", share(rr, "hit_rate")),
        ("least connections", share(lc, "hit_rate")),
        ("bounded-load hashing", share(bounded, "hit_rate")),
        ("prefill saved: round robin", share(rr, "prefill_saved")),
        ("least connections", share(lc, "prefill_saved")),
        ("hashing", share(bounded, "prefill_saved")),
        ("hit rate, one cache as large as the fleet's", lambda row: f"{row[rr]['extra']['pooled_hit_rate']:.1%}"),
    ]
    waited = [
        ("mean latency, s: round robin", seconds(rr)),
        ("least connections", seconds(lc)),
        ("bounded-load hashing", seconds(bounded)),
        (
            "hashing, no bound (its hit rate)",
            lambda row: f"{seconds(unbounded)(row)} ({share(unbounded, 'hit_rate')(row)})",
        ),
    ]
    return markdown(report, saved) + "\n" + markdown(report, waited)


def draw(report: dict[str, Any], path: Path) -> None:
    rows = by_size(report)
    sizes = list(rows)
    with figure(path, (7.5, 4.5)) as ax:
        for policy, colour in zip(POLICIES, ("tab:red", "tab:green", "tab:blue", "tab:cyan"), strict=True):
            ax.plot(sizes, [100 * rows[n][policy]["hit_rate"] for n in sizes], "o-", color=colour, label=policy)
            ax.plot(sizes, [100 * rows[n][policy]["prefill_saved"] for n in sizes], "--", color=colour, alpha=0.7)
        pooled_rates = [100 * rows[n][POLICIES[0]]["extra"]["pooled_hit_rate"] for n in sizes]
        ax.plot(sizes, pooled_rates, ":", color="grey", label="one cache as large as the fleet's")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_xlabel("replicas, each with the default cache (16 snapshots, 32,768 tokens)")
        ax.set_ylabel("hit rate, % (solid); prefill saved, % (dashed)")
        workload = report["workload"]
        ax.set_title(f"{workload['states']:,} states of Zipf {workload['zipf']:g} popularity, simulated")
        ax.set_ylim(0, 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Workload()
    parser.add_argument("--requests", type=int, default=defaults.requests)
    parser.add_argument("--states", type=int, default=defaults.states)
    parser.add_argument("--zipf", type=float, default=defaults.zipf)
    parser.add_argument("--load", type=float, default=defaults.load)
    parser.add_argument("--replicas", default="1,2,4,8,16,32,64", help="fleet sizes, comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    workload = Workload(requests=args.requests, states=args.states, zipf=args.zipf, load=args.load)
    report = run(workload, [int(n) for n in args.replicas.split(",")])
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out / "fleet-sim.json", json.dumps(report, indent=2) + "\n")
    write_atomically(args.out / "fleet-sim.md", table(report))
    draw(report, args.out / "fleet-sim.png")
    print(table(report))


if __name__ == "__main__":
    main()
