import math

import pytest

from app import scoring


def test_softmax_sums_to_one_and_orders_like_the_logits() -> None:
    p = scoring.softmax([2.0, 0.0, -1.0])
    assert math.isclose(sum(p), 1.0, abs_tol=1e-12)
    assert p[0] > p[1] > p[2]


def test_softmax_is_finite_for_extreme_logits() -> None:
    p = scoring.softmax([1e30, -1e30])
    assert p == [1.0, 0.0]


def test_softmax_rejects_non_finite_logits() -> None:
    with pytest.raises(ValueError):
        scoring.softmax([float("nan"), 1.0])


def test_choice_confidence_is_zero_for_uniform_and_one_for_certain() -> None:
    assert scoring.choice_confidence([0.25] * 4) == pytest.approx(0.0)
    assert scoring.choice_confidence([1.0, 0.0, 0.0]) == 1.0
    assert scoring.choice_confidence([0.89, 0.11]) == pytest.approx((0.89 - 0.5) / 0.5)


def test_uniform_spread_matches_the_contract_formula() -> None:
    assert scoring.uniform_spread(2) == pytest.approx(0.5)
    assert scoring.uniform_spread(3) == pytest.approx(2 / 3)


def test_score_confidence_follows_the_contract() -> None:
    p = [0.12, 0.44, 0.44]
    m = 1  # the first of the tied most likely levels
    expected = 1 - sum(pi * abs(i - m) for i, pi in enumerate(p)) / scoring.uniform_spread(3)
    assert scoring.score_confidence(p) == pytest.approx(expected)
    assert scoring.score_confidence([1.0, 0.0, 0.0]) == 1.0
    assert scoring.score_confidence([0.5, 0.0, 0.0, 0.0, 0.5]) == 0.0  # clamped


def test_expected_score_is_the_plain_sum_of_i_times_p() -> None:
    p = [0.1, 0.2, 0.3, 0.4]
    total = 0.0
    for i, pi in enumerate(p):
        total += i * pi
    assert scoring.expected_score(p) == total
