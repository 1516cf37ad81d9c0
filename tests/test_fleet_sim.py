"""bench/fleet_sim.py: HAProxy's bounded-load rule as lb_chash.c computes it, and the policies' ordering."""

from __future__ import annotations

from bench.fleet_sim import POLICIES, Ring, Workload, key_hash, run, slots, table


def test_the_bounded_load_slots_are_haproxys() -> None:
    # chash_server_is_eligible: ceil((served + 1) * factor / 100) slots, shared out by weight
    assert [slots(0, 3, i) for i in range(3)] == [1, 1, 1]  # never none: a replica with nothing in flight is eligible
    assert [slots(11, 3, i) for i in range(3)] == [6, 6, 6]  # 18 slots for 12 requests
    assert [slots(4, 3, i) for i in range(3)] == [2, 3, 3]  # 8 slots: the remainder goes to the later replicas
    assert [slots(99, 2, i) for i in range(2)] == [75, 75]  # 1.5 times the average of 50
    assert [slots(99, 2, i, factor=200) for i in range(2)] == [100, 100]


def test_a_replica_at_its_bound_passes_a_key_on_and_gets_it_back_once_free() -> None:
    ring = Ring(4)
    hashed = key_hash("0123456789abcdef")
    home = ring.pick(hashed)
    assert ring.pick(hashed, [0, 0, 0, 0]) == home
    # one request in flight: ceil(2 * 1.5) = 3 slots over 4 replicas, at most one each; home holds it
    spilled = ring.pick(hashed, [1 if replica == home else 0 for replica in range(4)])
    assert spilled != home
    assert ring.pick(hashed, [1 if replica == spilled else 0 for replica in range(4)]) == home


def test_hashing_keeps_more_of_a_fleet_cached_than_round_robin_or_least_connections() -> None:
    report = run(Workload(requests=6000, states=600), [1, 4], show_progress=False)
    rates = {(o["policy"], o["replicas"]): o["hit_rate"] for o in report["outcomes"]}
    assert len({rates[(policy, 1)] for policy in POLICIES}) == 1  # one replica: every policy is the same
    hashing = rates[("bounded-load hashing", 4)]
    assert hashing > rates[("round robin", 4)] + 0.05 and hashing > rates[("least connections", 4)] + 0.05
    assert rates[("hashing, no bound", 4)] >= hashing  # the bound trades hits for latency
    assert table(report).count("\n| 4 |") == 2
