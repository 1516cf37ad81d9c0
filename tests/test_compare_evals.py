"""bench/compare_evals.py: the paired comparison of two eval reports."""

from __future__ import annotations

import pytest

from bench.compare_evals import bootstrap_interval, compare, mcnemar_p, right_by_item, table


def test_mcnemar_is_the_exact_two_sided_binomial_tail() -> None:
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(5, 0) == mcnemar_p(0, 5) == 2 / 32
    assert mcnemar_p(15, 6) == pytest.approx(0.0784, abs=1e-4)  # 2 * P(X <= 6), X ~ Bin(21, 1/2)
    assert mcnemar_p(3, 3) == 1.0


def test_the_interval_is_of_the_paired_difference() -> None:
    assert bootstrap_interval([0] * 50) == (0.0, 0.0)
    assert bootstrap_interval([1] * 50) == (1.0, 1.0)
    low, high = bootstrap_interval([1] * 30 + [0] * 70)
    assert low < 0.3 < high and high - low < 0.25


def test_compare_counts_the_items_only_one_report_got_right() -> None:
    a = {"x": True, "y": True, "z": False, "w": True}
    b = {"x": True, "y": False, "z": True, "w": False}
    paired = compare(a, b)
    assert (paired.items, paired.only_a, paired.only_b) == (4, 2, 1)
    assert (paired.accuracy_a, paired.accuracy_b) == (0.75, 0.5)
    with pytest.raises(ValueError, match="different items"):
        compare(a, {"x": True})


def test_reports_are_read_at_their_most_probable_answer_and_split_by_type() -> None:
    report = {"items": {"calibrated": [["n1", [0.7, 0.3], 0], ["n2", [0.4, 0.6], 0], ["c1", [0.2, 0.5, 0.3], 1]]}}
    right = right_by_item(report, "served")
    assert right == {"n1": True, "n2": False, "c1": True}
    uncalibrated = {"items": {"raw": [["n1", [0.2, 0.8], 0]], "calibrated": []}}  # made with --calibration none
    assert right_by_item(uncalibrated, "served") == right_by_item(uncalibrated, "raw") == {"n1": False}
    rows = table(right, {"n1": False, "n2": False, "c1": True}, {"n1": "noul", "n2": "noul", "c1": "choice"})
    assert "| all | 3 | 0.667 | 0.333 | 1 | 0 |" in rows and "| noul | 2 | 0.500 | 0.000 | 1 | 0 |" in rows
