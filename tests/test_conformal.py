"""Answer sets (app/calibration/conformal.py) on synthetic answers: the set's order, the bound's rank,
a set holding the right label exactly when its nonconformity is within the bound, score sets that
are runs of adjacent levels, and coverage on exchangeable data: at least the level asked, at most a
little above it (the binomial spread of the draw, not a tuned tolerance)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.calibration.conformal import answer_set, held_out_sets, nonconformity, set_order, threshold


def test_a_choice_set_takes_the_labels_most_probable_first_ties_to_the_lower_index() -> None:
    assert set_order([0.2, 0.5, 0.2, 0.1], ordered=False) == [1, 0, 2, 3]


def test_a_score_set_grows_from_the_top_level_toward_its_more_probable_neighbour() -> None:
    assert set_order([0.1, 0.3, 0.4, 0.05, 0.15], ordered=True) == [2, 1, 0, 3, 4]
    assert set_order([0.5, 0.1, 0.4], ordered=True) == [0, 1, 2]  # adjacent first, even when less probable


def test_the_bound_is_the_ceil_n_plus_one_times_coverage_th_smallest_score() -> None:
    scores = [0.1 * i for i in range(1, 10)]  # 9 scores
    assert threshold(scores, 0.5) == pytest.approx(0.5)  # ceil(10 * 0.5) = 5th
    assert threshold(scores, 0.8) == pytest.approx(0.8)  # ceil(10 * 0.8) = 8th
    assert threshold(scores, 0.95) == math.inf  # rank 10 of 9: every label
    with pytest.raises(ValueError):
        threshold(scores, 1.0)


@pytest.mark.parametrize("ordered", [False, True])
def test_a_set_holds_the_right_label_exactly_when_its_nonconformity_is_within_the_bound(ordered: bool) -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(2, 8))
        p = rng.dirichlet(np.full(n, 0.5))
        right, bound = int(rng.integers(n)), float(rng.uniform(0, 1))
        labels = answer_set(p, bound, ordered)
        top = set_order(p, ordered)[0]
        assert (right in labels) == (nonconformity(p, right, ordered) <= bound or right == top)
        if ordered:
            assert sorted(labels) == list(range(min(labels), max(labels) + 1))


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("coverage", [0.8, 0.9, 0.95])
def test_sets_on_exchangeable_answers_cover_as_asked(ordered: bool, coverage: float) -> None:
    """Answers whose right labels are drawn from a distribution near, not equal to, their own (a
    miscalibrated model): split conformal still covers at the level asked, on average over splits."""
    rng = np.random.default_rng(1)
    n, labels = 600, 5
    predicted = rng.dirichlet(np.full(labels, 0.7), size=n)
    truth = 0.6 * predicted + 0.4 * rng.dirichlet(np.ones(labels), size=n)
    right = [int(rng.choice(labels, p=row / row.sum())) for row in truth]
    found = held_out_sets(predicted, right, ordered, coverages=[coverage])[f"{coverage:g}"]
    spread = 4 * math.sqrt(coverage * (1 - coverage) / (n / 2))  # four standard errors of one split's half
    assert coverage - spread <= found["coverage"] <= coverage + spread + 1 / (n / 2 + 1), found
    assert 1 <= found["size"] < labels


def test_sharper_answers_get_smaller_sets_at_the_same_coverage() -> None:
    rng = np.random.default_rng(2)
    right = [int(x) for x in rng.integers(0, 4, 400)]
    vague = np.full((400, 4), 0.25)
    sharp = np.full((400, 4), 0.02)
    for i, y in enumerate(right):
        if rng.uniform() < 0.95:
            sharp[i, y] = 0.94
        else:
            sharp[i, (y + 1) % 4] = 0.94
    vague_sets = held_out_sets(vague, right, False, coverages=[0.9])["0.9"]
    sharp_sets = held_out_sets(sharp, right, False, coverages=[0.9])["0.9"]
    assert sharp_sets["size"] < 1.2 < 3 < vague_sets["size"]
