"""Quality metrics of one question's probabilities against the right choices (scikit-learn).

Every function takes ``y``: the index of the right choice per row (int ``[n]``), and
``probabilities``: the choices' probabilities per row (float64 ``[n, k]``, rows sum to 1), and
``answers``: the index of the answer given per row (int ``[n]``, the most probable choice or a
threshold's decision).
"""

from __future__ import annotations

import math

import numpy as np

#: equal-width confidence bins of the expected calibration error
ECE_BINS = 15


def expected_calibration_error(y: np.ndarray, probabilities: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Top-label expected calibration error (Guo et al. 2017, eq. 3).

    ``ECE = sum_m |B_m| / n * |acc(B_m) - conf(B_m)|`` where a row's confidence is its highest
    probability, it is right when that choice is ``y``, and ``B_m`` holds the rows whose confidence
    lies in ``((m-1)/M, m/M]`` (a confidence of exactly 0 goes to the first bin).
    """
    conf = probabilities.max(axis=1)
    right = probabilities.argmax(axis=1) == y
    bins = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
    total = 0.0
    for m in range(n_bins):
        inside = bins == m
        if inside.any():
            total += inside.sum() / len(y) * abs(right[inside].mean() - conf[inside].mean())
    return float(total)


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
