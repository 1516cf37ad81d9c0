"""Which states to label next (app/fitting/ranking.py): the least sure answers first, near-copies of a
state taken or labelled pushed back, nothing labelled twice."""

from __future__ import annotations

import numpy as np

from app.calibration import AnswerProbabilities
from app.fitting.ranking import next_to_label, unsureness, worth


def test_a_wider_set_is_less_sure_and_a_certain_answer_is_worth_nothing() -> None:
    certain = AnswerProbabilities([1.0, 0.0, 0.0])
    one = AnswerProbabilities([0.6, 0.3, 0.1], answer_set=[0], coverage=0.9)
    two = AnswerProbabilities([0.6, 0.3, 0.1], answer_set=[0, 1], coverage=0.9)
    every = AnswerProbabilities([0.4, 0.3, 0.3], answer_set=[0, 1, 2], coverage=0.9)
    none = AnswerProbabilities([0.4, 0.3, 0.3], answer_set=[], coverage=0.9)
    assert unsureness(certain) == 0.0
    assert unsureness(one) < unsureness(two) < unsureness(every) == unsureness(none) <= 1.0
    assert worth({"a": certain, "b": every}) == unsureness(every) / 2


def test_near_copies_of_a_state_are_not_taken_one_after_another() -> None:
    rng = np.random.default_rng(0)
    vectors = [rng.normal(size=16).astype(np.float32) for _ in range(6)]
    vectors[1] = vectors[0] + 1e-3  # state 1 is state 0 again
    worths = [1.0, 0.99, 0.5, 0.4, 0.3, 0.2]
    first, second, *_ = next_to_label(worths, vectors, labelled=[], count=6)
    assert (first, second) == (0, 2)
    assert next_to_label(worths, vectors, labelled=[0], count=1) == [2]  # labelled: the copy is pushed back too
    assert set(next_to_label(worths, vectors, labelled=[0, 2], count=10)) == {1, 3, 4, 5}


def test_without_mean_vectors_the_worth_alone_orders_them() -> None:
    worths = [0.1, 0.9, 0.5, 0.9]
    assert next_to_label(worths, [None] * 4, labelled=[3], count=3) == [1, 2, 0]
    assert next_to_label(worths, [None] * 4, labelled=[0, 1, 2, 3], count=3) == []
