"""Quality metrics of one question's probabilities against the right choices (scikit-learn).

Every function takes ``y``: the index of the right choice per row (int ``[n]``), and
``probabilities``: the choices' probabilities per row (float64 ``[n, k]``, rows sum to 1), and
``answers``: the index of the answer given per row (int ``[n]``, the most probable choice or a
threshold's decision). Extraction questions: :func:`extraction_metrics`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

#: equal-width confidence bins of the expected calibration error
ECE_BINS = 15


def expected_calibration_error(y: np.ndarray, probabilities: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Top-label expected calibration error (Guo et al. 2017, eq. 3).

    ``ECE = sum_m |B_m| / n * |acc(B_m) - conf(B_m)|`` where a row's confidence is its highest
    probability, it is right when that choice is ``y``, and ``B_m`` holds the rows whose confidence
    lies in ``((m-1)/M, m/M]`` (a confidence of exactly 0 goes to the first bin).
    """
    return binary_calibration_error(probabilities.argmax(axis=1) == y, probabilities.max(axis=1), n_bins)


def auc(y: np.ndarray, probabilities: np.ndarray) -> float | None:
    """ROC AUC. Two choices: of the first choice's probability for "the first choice is right".
    More: macro average of one-vs-rest AUCs over the choices that are right in some row and wrong
    in another (scikit-learn's ``multi_class="ovr"``, ``average="macro"``). ``None`` when no choice
    has both."""
    from sklearn.metrics import roc_auc_score

    k = probabilities.shape[1]
    if k == 2:
        first = y == 0
        return float(roc_auc_score(first, probabilities[:, 0])) if 0 < first.sum() < len(y) else None
    per_choice = [roc_auc_score(y == j, probabilities[:, j]) for j in range(k) if 0 < (y == j).sum() < len(y)]
    return float(np.mean(per_choice)) if per_choice else None


#: resamples and level of :func:`auc_interval`
AUC_RESAMPLES = 1000
AUC_LEVEL = 0.95


def auc_interval(y: np.ndarray, probabilities: np.ndarray, *, resamples: int = AUC_RESAMPLES,
                 level: float = AUC_LEVEL, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of :func:`auc` (Efron & Tibshirani 1993, ch. 13): the rows
    are drawn with replacement ``resamples`` times (numpy generator seeded with ``seed``, so the
    same rows always give the same interval) and the ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles of the draws' AUCs taken (``scipy.stats.bootstrap``, ``method="percentile"``). A
    draw's AUC is :func:`auc` of its rows (:func:`draw_aucs`); a draw where it is undefined is
    left out. ``None`` when :func:`auc` is undefined on the rows themselves."""
    from scipy.stats import bootstrap

    if auc(y, probabilities) is None:
        return None
    res = bootstrap((np.arange(len(y)),), lambda index, axis=-1: draw_aucs(y, probabilities, index),
                    n_resamples=resamples, confidence_level=level, method="percentile", vectorized=True,
                    rng=np.random.default_rng(seed))
    draws = res.bootstrap_distribution  # scipy's percentiles would be NaN with one undefined draw
    lo, hi = np.nanquantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def draw_aucs(y: np.ndarray, probabilities: np.ndarray, index: np.ndarray) -> np.ndarray:
    """:func:`auc` of many draws of rows at once: ``index`` int ``[draws, m]`` (or ``[m]``) picks
    each draw's rows; float64 ``[draws]`` (or a scalar), NaN where undefined. Each one-vs-rest
    AUC is the Mann-Whitney statistic ``(R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg)`` with
    ``R_pos`` the sum of the positives' ranks among the draw's scores, ties at their mean rank
    (Hanley & McNeil 1982; ``scipy.stats.rankdata``)."""
    from scipy.stats import rankdata

    index = np.asarray(index)
    one = index.ndim == 1
    index = np.atleast_2d(index)
    k = probabilities.shape[1]
    ys = y[index]
    columns = [0] if k == 2 else range(k)
    per_choice = []
    for j in columns:
        pos = ys == j
        n_pos = pos.sum(axis=1).astype(np.float64)
        n_neg = index.shape[1] - n_pos
        ranks = rankdata(probabilities[index, j], axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            a = ((ranks * pos).sum(axis=1) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
        per_choice.append(np.where((n_pos > 0) & (n_neg > 0), a, np.nan))
    stacked = np.stack(per_choice)
    with warnings.catch_warnings():  # a draw where no choice has both kinds of rows: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        out = np.nanmean(stacked, axis=0)
    return out[0] if one else out


def has_signal(interval: tuple[float, float] | None) -> bool | None:
    """Whether an AUC interval (:func:`auc_interval`) excludes 0.5, i.e. the probabilities rank
    the rows better (or, mapped, worse) than chance beyond noise; ``None`` without an interval."""
    return None if interval is None else not interval[0] <= 0.5 <= interval[1]


def brier(y: np.ndarray, probabilities: np.ndarray) -> float:
    """Brier score. Two choices: ``mean((p_first - [first is right])^2)`` in [0, 1]; more:
    ``mean(sum_j (p_j - [j is right])^2)`` in [0, 2] (Brier 1950; scikit-learn's
    ``brier_score_loss`` with ``scale_by_half="auto"``)."""
    from sklearn.metrics import brier_score_loss

    k = probabilities.shape[1]
    if k == 2:
        return float(brier_score_loss((y == 0).astype(int), probabilities[:, 0], pos_label=1))
    return float(brier_score_loss(y, probabilities, labels=list(range(k))))


def question_metrics(y: np.ndarray, probabilities: np.ndarray, answers: np.ndarray) -> dict[str, float | None]:
    """``accuracy``, ``macro_f1``, ``auc``, ``log_loss`` (natural log), ``brier``, ``ece``.

    ``accuracy`` and ``macro_f1`` (F1 averaged over the choices that are right or answered in
    some row) are of ``answers``; the others of ``probabilities``.
    """
    from sklearn.metrics import accuracy_score, f1_score, log_loss

    k = probabilities.shape[1]
    return {
        "accuracy": float(accuracy_score(y, answers)),
        "macro_f1": float(f1_score(y, answers, average="macro")),
        "auc": auc(y, probabilities),
        "log_loss": float(log_loss(y, probabilities, labels=list(range(k)))),
        "brier": brier(y, probabilities),
        "ece": expected_calibration_error(y, probabilities),
    }


def baseline(y: np.ndarray, k: int) -> dict[str, float]:
    """What a constant answer gets on these rows: ``accuracy`` of always answering the most
    frequent right choice, and ``log_loss`` of always giving the rows' class frequencies."""
    from sklearn.metrics import log_loss

    prior = np.bincount(y, minlength=k) / len(y)
    return {
        "accuracy": float(prior.max()),
        "log_loss": float(log_loss(y, np.tile(prior, (len(y), 1)), labels=list(range(k)))),
    }


def clean(value: float | None) -> float | None:
    """``None`` for NaN/inf (JSON has no NaN), else the float."""
    return None if value is None or not math.isfinite(value) else value


# --------------------------------------------------------------------------- extraction questions

#: what :func:`same_text` strips from both ends of an answer (spaces, quotes, closing punctuation)
_TEXT_EDGES = " \t\n\"'“”‘’.,;:!?()[]"


def same_text(answer: str, expected: str) -> bool:
    """Whether an extracted text is the expected one: equal after case folding, collapsing runs of
    white space and stripping spaces, quotes and punctuation from both ends."""
    def norm(t: str) -> str:
        return " ".join(t.casefold().split()).strip(_TEXT_EDGES)
    return norm(answer) == norm(expected)


def extraction_right(expected: Any, score: dict[str, Any]) -> bool:
    """Whether one extraction record (``scores[qid]`` as JSON: ``answer``, ``value``,
    ``currency``) answers ``expected`` (:class:`spinf_stream.labelled.Expected`) exactly.

    none: the answer is the none word. number/money: the value is within 1e-9 (relative, at least
    1e-9 absolute) of the expected one, and for money the currency equals the expected ISO code
    when one is given. text: :func:`same_text` holds for one of the expected texts.
    """
    if expected.none:
        return score["answer"] is None
    if score["answer"] is None or score["value"] is None:
        return False
    if expected.texts:
        return any(same_text(str(score["value"]), t) for t in expected.texts)
    if abs(float(score["value"]) - expected.value) > 1e-9 * max(1.0, abs(expected.value)):
        return False
    return expected.currency is None or score.get("currency") == expected.currency


def binary_calibration_error(right: np.ndarray, confidence: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Expected calibration error of a confidence that an answer is right (Naeini et al. 2015):
    ``sum_m |B_m| / n * |acc(B_m) - conf(B_m)|``, bins as in :func:`expected_calibration_error`
    but on the confidence itself (``right``: bool ``[n]``, ``confidence``: float ``[n]`` in [0, 1])."""
    bins = np.clip(np.ceil(confidence * n_bins).astype(int) - 1, 0, n_bins - 1)
    total = 0.0
    for m in range(n_bins):
        inside = bins == m
        if inside.any():
            total += inside.sum() / len(right) * abs(right[inside].mean() - confidence[inside].mean())
    return float(total)


def extraction_metrics(expected: Sequence[Any], scores: Sequence[dict[str, Any]]) -> dict[str, float | int | None]:
    """One extraction question's numbers over its labelled rows (``expected[i]`` the
    :class:`~spinf_stream.labelled.Expected` of row *i*, ``scores[i]`` its record's
    ``scores[qid]`` as JSON):

    - ``n``, ``n_value`` (rows with a value), ``n_none`` (rows without one);
    - ``exact_match``: right answers (:func:`extraction_right`) among all rows;
      ``value_exact_match`` among the rows with a value; ``none_accuracy``: the none word among the
      rows without one; ``value_answered_none``: the none word among the rows with a value;
    - ``ece``: :func:`binary_calibration_error` of ``probability`` as the confidence that the
      answer is right; ``mean_probability``;
    - ``none_auc``: ROC AUC of ``none_probability`` for "the row has no value" (None without the
      none path or without rows of both kinds).

    A rate over no rows is None.
    """
    from sklearn.metrics import roc_auc_score

    right = np.array([extraction_right(e, s) for e, s in zip(expected, scores, strict=True)], dtype=bool)
    none = np.array([e.none for e in expected], dtype=bool)
    said_none = np.array([s["answer"] is None for s in scores], dtype=bool)
    conf = np.array([s["probability"] for s in scores], dtype=np.float64)
    none_p = [s["none_probability"] for s in scores]

    def rate(x: np.ndarray) -> float | None:
        return float(x.mean()) if len(x) else None

    none_auc = None
    if all(p is not None for p in none_p) and 0 < none.sum() < len(none):
        none_auc = float(roc_auc_score(none, np.array(none_p, dtype=np.float64)))
    return {
        "n": int(len(right)),
        "n_value": int((~none).sum()),
        "n_none": int(none.sum()),
        "exact_match": rate(right),
        "value_exact_match": rate(right[~none]),
        "none_accuracy": rate(said_none[none]),
        "value_answered_none": rate(said_none[~none]),
        "ece": binary_calibration_error(right, conf) if len(right) else None,
        "mean_probability": rate(conf),
        "none_auc": none_auc,
    }
