"""Quality metrics of a question: each equals scikit-learn's (or a hand computation) on small
hand-made sets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, brier_score_loss, f1_score, log_loss, roc_auc_score

from spinf_stream.quality import auc, baseline, brier, expected_calibration_error, question_metrics

# binary question: choices (yes, no); y = index of the right choice
Y2 = np.array([0, 0, 0, 1, 1, 1, 1, 0])
P_YES = np.array([0.9, 0.7, 0.4, 0.6, 0.2, 0.1, 0.3, 0.55])
P2 = np.stack([P_YES, 1 - P_YES], axis=1)
A2 = np.array([0, 0, 1, 0, 1, 1, 1, 0])

# three choices
Y3 = np.array([0, 1, 2, 2, 1, 0, 2, 1, 0])
P3 = np.array([
    [0.7, 0.2, 0.1], [0.3, 0.5, 0.2], [0.1, 0.3, 0.6], [0.4, 0.4, 0.2], [0.2, 0.2, 0.6],
    [0.5, 0.25, 0.25], [0.2, 0.1, 0.7], [0.1, 0.8, 0.1], [0.3, 0.4, 0.3],
])
A3 = P3.argmax(axis=1)


def test_binary_auc_is_of_the_first_choice_probability_for_the_first_choice_being_right():
    assert auc(Y2, P2) == pytest.approx(roc_auc_score(Y2 == 0, P_YES))


def test_multiclass_auc_is_the_macro_one_vs_rest_auc():
    assert auc(Y3, P3) == pytest.approx(roc_auc_score(Y3, P3, multi_class="ovr", average="macro"))


def test_auc_is_none_when_every_row_has_the_same_right_choice():
    assert auc(np.zeros(4, dtype=int), P2[:4]) is None


def test_binary_brier_is_the_mean_squared_error_of_the_first_choice():
    want = np.mean((P_YES - (Y2 == 0)) ** 2)  # by hand
    assert brier(Y2, P2) == pytest.approx(want)
    assert brier(Y2, P2) == pytest.approx(brier_score_loss(Y2 == 0, P_YES))


def test_multiclass_brier_sums_the_squared_errors_over_the_choices():
    want = np.mean(((P3 - np.eye(3)[Y3]) ** 2).sum(axis=1))  # Brier 1950, by hand
    assert brier(Y3, P3) == pytest.approx(want)


@pytest.mark.parametrize(("y", "p", "a"), [(Y2, P2, A2), (Y3, P3, A3)], ids=["binary", "three choices"])
def test_accuracy_macro_f1_and_log_loss_equal_scikit_learn(y, p, a):
    m = question_metrics(y, p, a)
    assert m["accuracy"] == pytest.approx(accuracy_score(y, a))
    assert m["macro_f1"] == pytest.approx(f1_score(y, a, average="macro"))
    assert m["log_loss"] == pytest.approx(log_loss(y, p))
    assert m["log_loss"] == pytest.approx(-np.mean(np.log(p[np.arange(len(y)), y])))


def test_accuracy_is_of_the_answers_given_not_of_the_most_probable_choice():
    threshold_answers = (P_YES < 0.35).astype(int)  # "yes" from p >= 0.35
    m = question_metrics(Y2, P2, threshold_answers)
    assert m["accuracy"] == pytest.approx(np.mean(threshold_answers == Y2))
    assert m["accuracy"] != pytest.approx(np.mean(P2.argmax(axis=1) == Y2))


def test_ece_matches_a_hand_computation_with_15_equal_width_bins():
    # top-label confidence, right?  → bin ((m-1)/15, m/15]
    rows = [
        ([0.95, 0.05], 0, True),   # bin 15 (14/15, 1]
        ([0.95, 0.05], 1, False),  # bin 15
        ([0.38, 0.62], 1, True),   # bin 10 (9/15, 10/15]
        ([0.55, 0.45], 0, True),   # bin 9 (8/15, 9/15]
        ([0.42, 0.58], 0, False),  # bin 9
        ([0.6, 0.4], 0, True),     # bin 9: 0.6 = 9/15 is the right edge of bin 9
    ]
    p = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    n = len(rows)
    want = (
        2 / n * abs(1 / 2 - 0.95)
        + 1 / n * abs(1 - 0.62)
        + 3 / n * abs(2 / 3 - (0.55 + 0.58 + 0.6) / 3)
    )
    assert expected_calibration_error(y, p) == pytest.approx(want)


def test_ece_is_zero_when_confidence_equals_accuracy_in_every_bin():
    p = np.array([[0.75, 0.25]] * 4)
    y = np.array([0, 0, 0, 1])
    assert expected_calibration_error(y, p) == pytest.approx(0.0)


def test_baseline_is_the_majority_accuracy_and_the_class_prior_log_loss():
    b = baseline(Y3, 3)
    assert b["accuracy"] == pytest.approx(3 / 9)
    prior = np.array([3, 3, 3]) / 9
    assert b["log_loss"] == pytest.approx(-math.log(1 / 3))
    assert b["log_loss"] == pytest.approx(log_loss(Y3, np.tile(prior, (9, 1))))
    b2 = baseline(Y2, 2)
    assert b2 == pytest.approx({"accuracy": 0.5, "log_loss": math.log(2)})


# --------------------------------------------------------------------------- signal (the AUC's interval)


def _ties(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of ``k`` choices, probabilities rounded to 0.05 so that many rows tie."""
    p = np.round(rng.dirichlet(np.ones(k), n) / 0.05) * 0.05 + 1e-3
    return rng.integers(0, k, n), p / p.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_the_auc_of_each_draw_is_scikit_learns_on_its_rows(k):
    from spinf_stream.quality import draw_aucs

    rng = np.random.default_rng(k)
    y, p = _ties(rng, 80, k)
    draws = rng.integers(0, 80, (12, 80))
    want = [roc_auc_score(y[d] == 0, p[d, 0]) if k == 2 else roc_auc_score(y[d], p[d], multi_class="ovr", average="macro")
            for d in draws]
    assert draw_aucs(y, p, draws) == pytest.approx(want, abs=1e-12)
    assert draw_aucs(y, p, np.arange(80)) == pytest.approx(auc(y, p), abs=1e-12)


def test_a_draw_without_both_kinds_of_rows_has_no_auc():
    from spinf_stream.quality import draw_aucs

    assert np.isnan(draw_aucs(Y2, P2, np.array([[0, 0, 1, 2]])))[0]


@pytest.mark.parametrize("shift", [0.0, 0.15, -0.15])
def test_the_bootstrap_interval_is_near_hanley_and_mcneils(shift):
    """On 600 rows the percentile interval is within 0.006 of AUC ± 1.96 SE, SE of Hanley and
    McNeil (1982, eq. 2) — another estimate of the same spread, not our code."""
    from spinf_stream.quality import auc_interval, has_signal

    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, 600)
    p_yes = np.clip(0.5 + shift * (y == 0) - shift * (y == 1) + rng.normal(0, 0.25, 600), 0.001, 0.999)
    p = np.stack([p_yes, 1 - p_yes], axis=1)
    a = roc_auc_score(y == 0, p_yes)
    n1, n0 = int((y == 0).sum()), int((y == 1).sum())
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    se = math.sqrt((a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n1 * n0))
    lo, hi = auc_interval(y, p)
    assert lo == pytest.approx(a - 1.96 * se, abs=0.006) and hi == pytest.approx(a + 1.96 * se, abs=0.006)
    assert lo < a < hi
    assert has_signal((lo, hi)) is (shift != 0.0)  # no shift: chance, the interval holds 0.5
    assert auc_interval(y, p) == (lo, hi)  # seeded: the same rows give the same interval


def test_no_interval_without_both_kinds_of_rows():
    from spinf_stream.quality import auc_interval, has_signal

    assert auc_interval(np.zeros(4, dtype=int), P2[:4]) is None and has_signal(None) is None
