"""Which states to label next (app/labelling/ranking.py): the least sure answers first, near-copies of a
state taken or labelled pushed back, nothing labelled twice."""

from __future__ import annotations

import numpy as np

from app.calibration import AnswerProbabilities, Fit, FitRecord
from app.labelling.ranking import DRAWN_EVERY, directions, drawn, next_to_label, unsureness, worth, worths


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
    unit = directions(vectors)
    assert unit is not None and np.allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    first, second, *_ = next_to_label(worths, unit, labelled=[], count=6)
    assert (first, second) == (0, 2)
    assert next_to_label(worths, unit, labelled=[0], count=1) == [2]  # labelled: the copy is pushed back too
    assert set(next_to_label(worths, unit, labelled=[0, 2], count=10)) == {1, 3, 4, 5}


def test_without_mean_vectors_the_worth_alone_orders_them() -> None:
    worths = [0.1, 0.9, 0.5, 0.9]
    assert directions([None, np.ones(4, dtype=np.float32), None, None]) is None
    assert next_to_label(worths, None, labelled=[3], count=3) == [1, 2, 0]
    assert next_to_label(worths, None, labelled=[0, 1, 2, 3], count=3) == []


def test_before_any_fit_every_state_is_worth_the_same_and_after_one_its_answers_decide() -> None:
    sure, unsure = AnswerProbabilities([0.99, 0.01]), AnswerProbabilities([0.5, 0.5])
    assert worths([{"q": sure}, {"q": unsure}]) == [1.0, 1.0]  # the model's own unsureness is not used
    record = FitRecord("k", {}, "vector/0.1", Fit("vector", ("true", "false")), 10)
    fitted = AnswerProbabilities([0.5, 0.5], fit=record, answer_set=[0, 1], coverage=0.9)
    found = worths([{"q": sure, "r": fitted}, {"q": unsure, "r": fitted}])
    assert found == [worth({"q": sure, "r": fitted}), worth({"q": unsure, "r": fitted})] and found[0] < found[1]


def test_one_label_in_four_goes_to_a_state_drawn_by_its_content_s_hash() -> None:
    keys = [f"ticket {i}" for i in range(10)]
    chosen = drawn(keys)
    assert len(chosen) == 3 and chosen == drawn(list(keys))  # ceil(10 / 4), a function of the contents
    assert drawn(keys[::-1]) == [9 - i for i in chosen]  # the same states whatever their order
    worths_ = [float(i) for i in range(10)]  # the ranking alone would take 9, 8, 7, ...
    rest = [i for i in range(9, -1, -1) if i not in chosen]
    first = next_to_label(worths_, None, [], 5, chosen)
    assert first == [chosen[0], *rest[:3], chosen[1]]  # labels 0 and 4 of DRAWN_EVERY = 4 are drawn
    assert DRAWN_EVERY == 4
    later = next_to_label(worths_, None, first, 4, chosen)
    assert later == [*rest[3:6], chosen[2]]  # labels 5, 6, 7 ranked, 8 drawn
