"""Answer sets (app/calibration/conformal.py) on synthetic answers: the nonconformities, the bound's
rank, a set holding a label exactly when its nonconformity is within the bound, score sets that are
runs of adjacent levels, and coverage on exchangeable data: at least the level asked, at most a
little above it (the binomial spread of the draw, not a tuned tolerance)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.calibration.conformal import answer_set, held_out_sets, nonconformity, threshold


def test_a_choice_label_s_nonconformity_is_the_probability_it_lacks() -> None:
    assert nonconformity([0.2, 0.5, 0.2, 0.1], 3, ordered=False) == pytest.approx(0.9)
    assert answer_set([0.2, 0.5, 0.2, 0.1], 0.85, ordered=False) == [1, 0, 2]  # most probable first, ties by index


def test_a_score_level_needs_every_level_between_it_and_the_top_one() -> None:
    p = [0.3, 0.05, 0.4, 0.25]
    assert nonconformity(p, 0, ordered=True) == pytest.approx(0.95)  # level 1 lies between: 0.05
    assert nonconformity(p, 3, ordered=True) == pytest.approx(0.75)
    assert answer_set(p, 0.8, ordered=True) == [2, 3]  # level 0 is more probable, but not adjacent


def test_the_bound_is_the_ceil_n_plus_one_times_coverage_th_smallest_score() -> None:
    scores = [0.1 * i for i in range(1, 10)]  # 9 scores
    assert threshold(scores, 0.5) == pytest.approx(0.5)  # ceil(10 * 0.5) = 5th
    assert threshold(scores, 0.8) == pytest.approx(0.8)  # ceil(10 * 0.8) = 8th
    assert threshold(scores, 0.95) == math.inf  # rank 10 of 9: every label
    with pytest.raises(ValueError):
        threshold(scores, 1.0)


@pytest.mark.parametrize("ordered", [False, True])
def test_a_set_holds_a_label_exactly_when_its_nonconformity_is_within_the_bound(ordered: bool) -> None:
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(2, 8))
        p = rng.dirichlet(np.full(n, 0.5))
        bound = float(rng.uniform(0, 1))
        labels = answer_set(p, bound, ordered)
        assert set(labels) == {y for y in range(n) if nonconformity(p, y, ordered) <= bound}
        if ordered and labels:
            assert labels == list(range(min(labels), max(labels) + 1))
        assert answer_set(p, math.inf, ordered) == (
            list(range(n)) if ordered else sorted(range(n), key=lambda i: -p[i])
        )


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
    assert 0 < found["size"] < labels


def test_a_sure_and_right_model_gets_sets_of_about_one_label_a_vague_one_of_all() -> None:
    rng = np.random.default_rng(2)
    right = [int(x) for x in rng.integers(0, 4, 400)]
    sure = np.full((400, 4), 0.02)
    for i, y in enumerate(right):
        sure[i, y if rng.uniform() < 0.97 else (y + 1) % 4] = 0.94
    vague = np.full((400, 4), 0.25)
    assert held_out_sets(sure, right, False, coverages=[0.9])["0.9"]["size"] < 1.2
    assert held_out_sets(vague, right, False, coverages=[0.9])["0.9"]["size"] == 4.0
