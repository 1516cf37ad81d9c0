"""Fitting calibration to labelled examples (app/calibration/candidates.py, choosing.py): each candidate learns
what it can, the choice is cross-validated, and a fit that does not beat contextual calibration is not adopted."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.calibration.candidates import (
    PROBE_MAX_LABELS,
    ProbeCandidate,
    QuestionSetCandidate,
    VectorCandidate,
    fit_batch,
)
from app.calibration.choosing import MIN_LABELLED, TooFewExamples, choose, fold_count, folds, uncovered
from app.calibration.evidence import Example, SetRow, log_ratio
from app.calibration.fit import Fit, softmax
from app.calibration.metrics import scores
from tests.support.examples import LABELS, biased


def test_a_label_bias_is_learned_and_adopted_and_it_helps_on_new_examples() -> None:
    train, test = biased(100, 1, (2.0, 0.0, -1.0), 0.3), biased(400, 2, (2.0, 0.0, -1.0), 0.3)
    choice = choose(train, temperature=1.0)
    assert choice.adopted and choice.method.startswith("vector") and choice.fit is not None
    assert choice.after.log_loss < choice.before.log_loss and choice.after.accuracy > choice.before.accuracy + 0.2
    shipped = scores(softmax(np.stack([log_ratio(e.raw, e.prior) for e in test])), np.asarray([e.right for e in test]))
    fit = choice.fit
    fitted = scores(
        np.asarray([fit.apply(e.labels, e.raw, e.prior) for e in test]), np.asarray([e.right for e in test])
    )
    assert fitted.log_loss < shipped.log_loss and fitted.accuracy > shipped.accuracy + 0.2


def test_what_is_already_calibrated_keeps_contextual_calibration() -> None:
    rng = np.random.default_rng(3)
    examples = []
    for _ in range(120):  # the right label drawn from exactly the distribution contextual calibration gives
        raw = softmax(rng.normal(0, 1.5, 3))
        examples.append(Example(LABELS, tuple(float(p) for p in raw), (1 / 3,) * 3, int(rng.choice(3, p=raw))))
    choice = choose(examples, temperature=1.0)
    assert not choice.adopted and choice.fit is None and choice.method == "contextual"
    assert choice.after == choice.before
    assert all(loss >= choice.before.log_loss for loss in choice.candidates.values())


def test_a_fit_applies_by_label_name_whatever_the_order_of_the_options() -> None:
    fit = VectorCandidate(temperature=1.0, penalty=0.03).fit(biased(80, 4, (1.0, 0.0, -0.5), 0.5))
    raw, prior = (0.5, 0.3, 0.2), (0.4, 0.35, 0.25)
    forward = dict(zip(LABELS, fit.apply(LABELS, raw, prior), strict=True))
    order = [2, 0, 1]
    shuffled = [LABELS[i] for i in order]
    backward = dict(zip(shuffled, fit.apply(shuffled, [raw[i] for i in order], [prior[i] for i in order]), strict=True))
    assert forward == pytest.approx(backward, rel=1e-12, abs=0)


def test_batch_calibration_divides_out_the_mean_answer_over_real_states() -> None:
    examples = biased(200, 5, (1.5, 0.0, 0.0), 1.0)
    fit = fit_batch(examples, temperature=1.0)
    assert fit.prior is not None
    assert fit.prior == pytest.approx(tuple(np.mean([e.raw for e in examples], axis=0)))
    assert fit.prior[0] > 0.5  # the preferred label's share, learned without a single label
    corrected = np.asarray([fit.apply(e.labels, e.raw, e.prior) for e in examples]).mean(0)
    assert max(corrected) - min(corrected) < max(fit.prior) - min(fit.prior)


def with_rows(examples: list[Example], rows: list[SetRow]) -> list[Example]:
    """The examples, each with every question's ratios about its state: question-set fits are tried."""
    return [replace(e, row=row) for e, row in zip(examples, rows, strict=True)]


def on_rows(rows: list[SetRow], rights: list[int]) -> list[Example]:
    """Examples that carry only their set rows and right answers: what a question-set fit reads."""
    return [Example((), (), (), right, row=row) for row, right in zip(rows, rights, strict=True)]


def test_a_question_set_fit_reads_the_other_questions_answers() -> None:
    """The right answer to B is A's: alone B's readout says nothing, with A's readout it is easy."""
    rng = np.random.default_rng(6)
    rows, rights = [], []
    for _ in range(120):
        a = int(rng.integers(2))
        a_raw = softmax(np.asarray([1.0, -1.0]) * (1 if a == 0 else -1) + rng.normal(0, 0.3, 2))
        b_raw = softmax(rng.normal(0, 1, 2))
        rows.append(
            SetRow({"a": (("x", "y"), log_ratio(a_raw, (0.5, 0.5))), "b": (("u", "v"), log_ratio(b_raw, (0.5, 0.5)))})
        )
        rights.append(a)
    fit = QuestionSetCandidate("b", penalty=0.1).fit(on_rows(rows[:100], rights[:100]))
    p = np.asarray([fit.apply(("u", "v"), (), (), None, row.ratios) for row in rows[100:]])
    assert scores(p, np.asarray(rights[100:])).accuracy >= 0.9
    examples = [
        Example(("u", "v"), tuple(np.exp(row.ratios["b"][1]) / 2), (0.5, 0.5), right)
        for row, right in zip(rows, rights, strict=True)
    ]
    alone = choose(examples, temperature=1.0)
    together = choose(with_rows(examples, rows), temperature=1.0, key="b")
    assert together.method.startswith("question_set") and together.after.accuracy > alone.after.accuracy + 0.3


def test_an_ordinal_question_set_fit_shares_one_signal_across_a_scores_levels() -> None:
    """A 5-level score set by a noul's evidence: with few examples the ordinal fit (one weight vector
    scaled by the level) learns it better than a weight vector per level, and is the one chosen."""
    rng = np.random.default_rng(7)
    levels = tuple(str(k) for k in range(5))
    rows, rights = [], []
    for _ in range(400):
        signal = rng.normal(0, 1.5)
        level = int(np.clip(np.round(signal + 2 + rng.normal(0, 0.4)), 0, 4))
        a_raw = softmax(np.asarray([signal, -signal]) / 2)
        s_raw = softmax(rng.normal(0, 1, 5))
        rows.append(
            SetRow(
                {"a": (("false", "true"), log_ratio(a_raw, (0.5, 0.5))), "s": (levels, log_ratio(s_raw, (0.2,) * 5))}
            )
        )
        rights.append(level)
    ordinal = QuestionSetCandidate("s", penalty=0.01, ordinal=True).fit(on_rows(rows[:30], rights[:30]))
    free = QuestionSetCandidate("s", penalty=0.01).fit(on_rows(rows[:30], rights[:30]))
    weights = np.asarray(ordinal.weights)[:, :-1]
    assert weights == pytest.approx(np.outer(range(5), weights[1]), abs=1e-12)  # level k reads k times one vector
    held = np.asarray(rights[30:])
    found = {
        name: scores(np.asarray([fit.apply(levels, (), (), None, row.ratios) for row in rows[30:]]), held)
        for name, fit in (("ordinal", ordinal), ("free", free))
    }
    assert found["ordinal"].log_loss < found["free"].log_loss
    examples = [
        Example(levels, tuple(float(p) for p in softmax(row.ratios["s"][1])), (0.2,) * 5, right)
        for row, right in zip(rows[:30], rights[:30], strict=True)
    ]
    choice = choose(with_rows(examples, rows[:30]), temperature=1.0, key="s", ordered=True)
    assert choice.method.startswith("question_set/ordinal") and choice.fit is not None
    assert choice.fit.method == "question_set"  # applied like any question-set fit


def test_scores_match_their_definitions() -> None:
    p = np.asarray([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.55, 0.45]])
    right = np.asarray([0, 1, 1, 0])
    found = scores(p, right)
    assert found.accuracy == 0.75
    assert found.brier == pytest.approx(np.mean([0.02, 0.72, 0.08, 0.405]))
    # bins (0.5, 0.6]: answers at 0.6 and 0.55, one right; (0.7, 0.8]: 0.8, right; (0.8, 0.9]: 0.9, right
    assert found.ece == pytest.approx((2 * abs(0.5 - 0.575) + abs(1.0 - 0.8) + abs(1.0 - 0.9)) / 4)
    assert [b["n"] for b in found.reliability] == [2, 1, 1]


def hidden_rule(n: int, seed: int, width: int = 24) -> list[Example]:
    """The right label is read off one direction of the hidden vector; the label readout says nothing."""
    rng = np.random.default_rng(seed)
    direction = np.random.default_rng(99).normal(0, 1, width)
    found = []
    for _ in range(n):
        hidden = rng.normal(0, 1, width) * np.linspace(0.2, 3.0, width)  # dimensions of unequal spread
        right = 0 if hidden @ direction > 0 else 1
        raw = softmax(rng.normal(0, 0.3, 2))
        found.append(Example(("false", "true"), tuple(map(float, raw)), (0.5, 0.5), right, hidden.astype(np.float32)))
    return found


def test_a_probe_learns_what_the_hidden_state_says_and_the_readout_does_not() -> None:
    train, test = hidden_rule(120, 1), hidden_rule(400, 2)
    choice = choose(train, temperature=1.0)
    assert choice.adopted and choice.method.startswith("probe/") and choice.fit is not None
    assert choice.after.accuracy > 0.8 and choice.before.accuracy < 0.65
    best_readout = min(loss for name, loss in choice.candidates.items() if not name.startswith("probe/"))
    assert choice.candidates[choice.method] < best_readout
    predicted = np.asarray([choice.fit.apply(e.labels, e.raw, e.prior, e.hidden) for e in test])
    assert scores(predicted, np.asarray([e.right for e in test])).accuracy > 0.8


def test_a_probe_applies_by_label_name_and_survives_its_file_format() -> None:
    train = hidden_rule(60, 3)
    fit = Fit.from_json(ProbeCandidate(temperature=1.0, penalty=0.001).fit(train).to_json())
    e = train[0]
    forward = dict(zip(e.labels, fit.apply(e.labels, e.raw, e.prior, e.hidden), strict=True))
    backward = fit.apply(e.labels[::-1], e.raw[::-1], e.prior[::-1], e.hidden)
    assert dict(zip(e.labels[::-1], backward, strict=True)) == pytest.approx(forward, rel=1e-12, abs=0)
    with pytest.raises(ValueError, match="hidden vector"):
        fit.apply(e.labels, e.raw, e.prior, None)


def test_no_probe_is_tried_without_hidden_states_or_with_too_many_labels() -> None:
    without = [Example(e.labels, e.raw, e.prior, e.right) for e in hidden_rule(40, 4)]
    assert not any(name.startswith("probe/") for name in choose(without, temperature=1.0).candidates)
    rng = np.random.default_rng(5)
    labels = tuple(f"o{i}" for i in range(PROBE_MAX_LABELS + 1))
    many = [
        Example(
            labels,
            tuple(map(float, softmax(rng.normal(0, 1, len(labels))))),
            (1 / len(labels),) * len(labels),
            int(rng.integers(len(labels))),
            rng.normal(0, 1, 8).astype(np.float32),
        )
        for _ in range(40)
    ]
    assert not any(name.startswith("probe/") for name in choose(many, temperature=1.0).candidates)


def test_few_examples_are_cross_validated_in_fewer_folds_and_too_few_are_not_fitted() -> None:
    examples = biased(40, 7, (2.0, 0.0, -1.0), 0.3)
    assert [fold_count(n) for n in (4, 8, 9, 10, 40)] == [2, 4, 4, 5, 5]
    with pytest.raises(
        TooFewExamples, match=f"7 labelled examples: a cross-validated fit needs at least {MIN_LABELLED}"
    ):
        choose(examples[:7], temperature=1.0)
    for n in (MIN_LABELLED, 9):
        few = [*[e for e in examples if e.right != 0][: n - 1], next(e for e in examples if e.right == 0)]
        choice = choose(few, temperature=1.0)
        assert choice.folds == 4 and set(choice.candidates) > {"temperature", "batch"}
        assert all(np.isfinite(loss) for loss in choice.candidates.values())
    with pytest.raises(ValueError, match="cannot be split into 5 folds"):
        folds(["a", "b", "c", "d", "d"], 5)


def test_folds_keep_each_state_whole() -> None:
    distinct = [str(i) for i in range(23)]
    order = np.random.default_rng(23).permutation(23)
    assert folds(distinct, 5) == [sorted(int(i) for i in order[f::5]) for f in range(5)]
    states = [f"s{i % 7}" for i in range(30)]
    found = folds(states, 4)
    assert sorted(i for fold in found for i in fold) == list(range(30))
    for state in set(states):
        assert sum(any(states[i] == state for i in fold) for fold in found) == 1


def test_a_state_asked_several_times_is_held_out_whole() -> None:
    # Each state labelled three times alike, its label drawn at random and its vector its own: nothing
    # in a state tells its label. Held out one example at a time, a state probe finds the state's other
    # examples among those it learned from and looks right; held out a state at a time, it cannot.
    rng = np.random.default_rng(5)
    examples = []
    for s in range(30):
        vector, right = rng.normal(0, 1, 16).astype(np.float32), int(rng.integers(3))
        examples += [Example(LABELS, (1 / 3,) * 3, (1 / 3,) * 3, right, state_mean=vector, state=f"s{s}")] * 3
    unnamed = choose([replace(e, state=None) for e in examples], temperature=1.0)
    assert unnamed.method.startswith("state_probe") and unnamed.after.accuracy > 0.9
    grouped = choose(examples, temperature=1.0)
    assert not grouped.method.startswith("state_probe") and grouped.after.accuracy < 0.6
    with pytest.raises(TooFewExamples, match="9 labelled examples of 3 states"):
        choose(examples[:9], temperature=1.0)


def test_labels_no_example_picks_get_no_per_label_fit() -> None:
    # every right answer is A or B: a vector fit would learn "never C", which no held-out fold can check
    examples = [e for e in biased(150, 8, (2.0, 0.0, -1.0), 0.3) if e.right != 2]
    assert uncovered(examples) == ["C"]
    hidden = [replace(e, hidden=np.ones(4, dtype=np.float32) * i) for i, e in enumerate(examples)]
    rows = [SetRow({"q": (LABELS, log_ratio(e.raw, e.prior))}) for e in examples]
    choice = choose(with_rows(hidden, rows), 1.0, key="q")
    assert set(choice.candidates) == {"temperature", "batch"}
    assert choice.not_tried is not None and "no example's answer is C (2 of 3 labels seen)" in choice.not_tried
    every = choose(biased(150, 8, (2.0, 0.0, -1.0), 0.3), 1.0)
    assert every.not_tried is None and any(name.startswith("vector/") for name in every.candidates)


def test_a_state_probe_learns_what_the_states_mean_says_and_is_told_apart_from_the_probe() -> None:
    """The same rule in the state's mean vector, with a hidden vector that carries nothing: the
    state probe is chosen, keeps its own method, reads nothing of the readout (so a server need not
    decode one) and needs the state's mean to apply."""
    rng = np.random.default_rng(7)

    def moved(examples: list[Example]) -> list[Example]:
        noise = [rng.normal(0, 1, e.hidden.shape).astype(np.float32) for e in examples if e.hidden is not None]
        return [replace(e, hidden=h, state_mean=e.hidden) for e, h in zip(examples, noise, strict=True)]

    train, test = moved(hidden_rule(120, 1)), moved(hidden_rule(400, 2))
    choice = choose(train, temperature=1.0)
    assert choice.adopted and choice.method.startswith("state_probe/") and choice.fit is not None
    assert choice.fit.method == "state_probe" and choice.fit.reads_state_mean and not choice.fit.reads_hidden
    fit = Fit.from_json(choice.fit.to_json())
    predicted = np.asarray([fit.apply(e.labels, e.raw, e.prior, None, None, e.state_mean) for e in test])
    assert scores(predicted, np.asarray([e.right for e in test])).accuracy > 0.8
    assert not fit.reads_readout and fit.scale == 0.0
    for e in test[:20]:  # the readout's raw probabilities change nothing: the answer is the state's
        flipped = tuple(reversed(e.raw))
        assert fit.apply(e.labels, flipped, e.prior, None, None, e.state_mean) == fit.apply_to_state(
            e.labels, e.state_mean
        )
    with pytest.raises(ValueError, match="reads its question's readout"):
        replace(fit, method="probe").apply_to_state(test[0].labels, test[0].state_mean)
    with pytest.raises(ValueError, match="the state's mean vector"):
        fit.apply(test[0].labels, test[0].raw, test[0].prior, test[0].hidden)
    without = [replace(e, state_mean=None) for e in train]
    assert not any(name.startswith("state_probe/") for name in choose(without, temperature=1.0).candidates)


def test_the_answer_sets_are_bounded_by_the_examples_drawn_like_the_traffic_when_enough_are() -> None:
    examples = biased(100, 1, (2.0, 0.0, -1.0), 0.3)
    quarter = [i % 4 == 0 for i in range(100)]  # onepass label's random draws among ranked states
    fit = choose(examples, temperature=1.0, drawn=quarter).fit
    assert fit is not None and len(fit.conformity) == 25
    few = [i < MIN_LABELLED - 1 for i in range(100)]  # too few to bound a set: every example does
    fit = choose(examples, temperature=1.0, drawn=few).fit
    assert fit is not None and len(fit.conformity) == 100
