import math

import pytest

from app import confidence
from app.calibration import softmax


def test_softmax_matches_values_worked_out_by_hand() -> None:
    assert softmax([0.0, math.log(3)]) == pytest.approx([0.25, 0.75], abs=1e-15)
    # e^2, e^0, e^-1 = 7.389056, 1, 0.367879; their sum 8.756935
    assert softmax([2.0, 0.0, -1.0]) == pytest.approx([0.843795, 0.114195, 0.042010], abs=1e-6)


def test_softmax_is_finite_for_extreme_logits() -> None:
    p = softmax([1e30, -1e30])
    assert p == [1.0, 0.0]


def test_softmax_rejects_non_finite_logits() -> None:
    with pytest.raises(ValueError):
        softmax([float("nan"), 1.0])


def test_choice_confidence_by_hand() -> None:
    assert confidence.choice_confidence([0.25] * 4) == pytest.approx(0.0)  # uniform
    assert confidence.choice_confidence([1.0, 0.0, 0.0]) == 1.0  # certain
    assert confidence.choice_confidence([0.89, 0.11]) == pytest.approx(0.78)  # (0.89 - 1/2) / (1 - 1/2)
    assert confidence.choice_confidence([0.5, 0.3, 0.2]) == pytest.approx(0.25)  # (0.5 - 1/3) / (2/3)


def test_uniform_spread_by_hand() -> None:
    assert confidence.uniform_spread(2) == pytest.approx(0.5)  # (0.5 + 0.5) / 2
    assert confidence.uniform_spread(3) == pytest.approx(2 / 3)  # (1 + 0 + 1) / 3
    assert confidence.uniform_spread(4) == pytest.approx(1.0)  # (1.5 + 0.5 + 0.5 + 1.5) / 4
    assert confidence.uniform_spread(5) == pytest.approx(1.2)  # (2 + 1 + 0 + 1 + 2) / 5


def test_score_confidence_by_hand() -> None:
    # m = 1 (the first of the tied most likely levels): 1 - (0.12 * 1 + 0.44 * 1) / (2/3) = 1 - 0.84
    assert confidence.score_confidence([0.12, 0.44, 0.44]) == pytest.approx(0.16)
    # m = 2: 1 - 0.1 * 1 / 1.2
    assert confidence.score_confidence([0.0, 0.0, 0.9, 0.1, 0.0]) == pytest.approx(11 / 12)
    assert confidence.score_confidence([1.0, 0.0, 0.0]) == 1.0
    # m = 3: 1 - (0.1 * 3 + 0.2 * 2 + 0.3 * 1) / 1 = 0
    assert confidence.score_confidence([0.1, 0.2, 0.3, 0.4]) == pytest.approx(0.0, abs=1e-12)
    assert confidence.score_confidence([0.5, 0.0, 0.0, 0.0, 0.5]) == 0.0  # 1 - 2 / 1.2 < 0: clamped


def test_expected_score_is_exactly_the_contracts_sum() -> None:
    # CONTRACT.md: score is exactly sum_i i * p_i of the returned probabilities, as a client adds it up
    assert confidence.expected_score([0.1, 0.2, 0.3, 0.4]) == 0 * 0.1 + 1 * 0.2 + 2 * 0.3 + 3 * 0.4
    assert confidence.expected_score([0.1, 0.2, 0.3, 0.4]) == pytest.approx(2.0)
    assert confidence.expected_score([0.12, 0.44, 0.44]) == pytest.approx(1.32)  # the contract's example
