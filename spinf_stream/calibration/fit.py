"""Fitting a pack's calibration on labelled rows (scipy, scikit-learn): maps, thresholds, cross-validation.

Every method fits the map of :mod:`spinf_stream.calibration.maps` (``softmax_j(scale_j * l_j +
bias_j)``, or a full ``W`` for ``matrix``), so applying one costs a few flops per choice and no
forward pass:

- ``contextual`` (Zhao et al. 2021, "Calibrate Before Use", eq. 1 with W = diag(p_cf)^-1, b = 0):
  score content-free inputs ("N/A", ...) once, average their choice probabilities ``p_cf`` and
  divide them out: ``scale_j = 1``, ``bias_j = -log p_cf_j``. Needs no labels.
- ``temperature`` (Guo et al. 2017, §4.2): one ``T > 0`` per question, ``scale_j = 1/T``,
  ``bias_j = 0``; fitted by minimising the log loss (scipy).
- ``vector`` (Guo et al. 2017, §4.2, vector scaling with a diagonal W): ``scale_j`` and
  ``bias_j`` per choice; fitted by minimising the log loss (scipy, L-BFGS).
- ``platt`` (Platt 1999): for two choices, a logistic regression on the log-odds
  ``l_1 - l_2`` (scikit-learn), i.e. ``scale = (a, a)``, ``bias = (c, 0)``; for more choices the
  same family — one shared scale and a bias per choice — fitted like ``vector``.
- ``matrix`` (Guo et al. 2017, §4.2, matrix scaling; on log-probabilities it is the Dirichlet
  calibration of Kull et al. 2019, "Beyond temperature scaling", NeurIPS): a full ``W`` and a
  bias per choice, i.e. a multinomial logistic regression on the ``k`` logprobs (scikit-learn's
  ``LogisticRegressionCV``, L2 strength chosen by inner cross-validated log loss). Lets one
  choice's logprob move another's probability, which a diagonal map cannot (what it gains on
  the shipped packs: ``packs/README.md``).

Never batch calibration (estimating a bias from the current batch): a message's score must not
depend on its neighbours (``DESIGN.md``, "Decisions users can act on").

scipy and scikit-learn are imported inside the functions that use them, so importing this module
(as the ``calibrate`` command's options do) imports neither.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spinf_stream.calibration.maps import METHODS, Calibration, FittedOn, ModelIdentity, QuestionCalibration, pack_identity
from spinf_stream.packs import Pack
from spinf_stream.softmax import softmax

#: Content-free inputs of contextual calibration (Zhao et al. 2021 use "N/A", "" and "[MASK]";
#: an empty field is not a valid message here, so a third neutral string takes its place).
CONTENT_FREE = ("N/A", "[MASK]", "None")
#: the forms of a decision target (``calibrate --target``)
TARGET_PATTERN = r"^(accuracy|f1|(precision|recall)=(0(\.\d+)?|1(\.0+)?))$"
_TARGET = re.compile(TARGET_PATTERN)


def parse_target(target: str) -> tuple[str, float | None]:
    """``"accuracy"``, ``"f1"``, ``"precision=0.9"``, ``"recall=0.8"`` → ``(kind, value)``.

    Raises ``ValueError`` naming the allowed forms.
    """
    if not _TARGET.match(target):
        raise ValueError(f"target {target!r}: use accuracy, f1, precision=P or recall=R (P, R in [0, 1])")
    kind, _, value = target.partition("=")
    return kind, float(value) if value else None


def choose_threshold(p_first: np.ndarray, first_is_right: np.ndarray, target: str) -> float | None:
    """Decision threshold on the first choice's calibrated probability for ``target``.

    ``accuracy``: ``None`` (the most probable choice: optimal for accuracy when the probabilities
    are calibrated). ``f1``: the threshold that maximises the first choice's F1 on these rows.
    ``precision=P``: the lowest threshold whose precision is at least P (the most recall at that
    precision; if none reaches P, the one with the highest precision). ``recall=R``: the highest
    threshold whose recall is at least R. Candidates come from
    ``sklearn.metrics.precision_recall_curve``; the one chosen is then moved halfway down to the
    next lower probability among the rows, which answers these rows the same but puts no row's
    probability on the boundary (a last-bit difference cannot flip an answer there).
    """
    from sklearn.metrics import precision_recall_curve

    kind, value = parse_target(target)
    if kind == "accuracy" or first_is_right.all() or not first_is_right.any():
        return None
    precision, recall, thresholds = precision_recall_curve(first_is_right, p_first)
    precision, recall = precision[:-1], recall[:-1]  # the last point has no threshold
    if kind == "f1":
        with np.errstate(invalid="ignore", divide="ignore"):
            f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
        return _off_the_rows(float(thresholds[int(np.argmax(f1))]), p_first)
    assert value is not None
    if kind == "precision":
        ok = np.flatnonzero(precision >= value)
        i = int(np.argmax(precision)) if ok.size == 0 else int(ok[0])
        return _off_the_rows(float(thresholds[i]), p_first)
    ok = np.flatnonzero(recall >= value)
    return _off_the_rows(float(thresholds[ok[-1]]), p_first)


def _off_the_rows(threshold: float, p_first: np.ndarray) -> float:
    """``threshold`` (one row's probability) moved halfway to the next lower row probability (or
    to 0): the same rows stay at or above it, none lies on it."""
    below = p_first[p_first < threshold]
    lower = float(below.max()) if below.size else 0.0
    return (threshold + lower) / 2


def _fit_affine(lp: np.ndarray, y: np.ndarray, *, shared_scale: bool, with_bias: bool) -> tuple[np.ndarray, np.ndarray]:
    """Minimise the mean log loss of ``softmax(scale * lp + bias)`` (L-BFGS, analytic gradient).

    The last choice's bias is fixed at 0 (softmax is shift-invariant). A ridge of 1e-4 pulls
    scales towards 1 and biases towards 0 so that separable rows keep finite parameters.
    """
    from scipy.optimize import minimize

    n, k = lp.shape
    ns = 1 if shared_scale else k
    nb = k - 1 if with_bias else 0
    onehot = np.eye(k)[y]
    ridge = 1e-4

    def unpack(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s = np.full(k, theta[0]) if shared_scale else theta[:ns]
        b = np.zeros(k)
        b[:nb] = theta[ns:]
        return s, b

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        s, b = unpack(theta)
        z = lp * s + b
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        value = -(onehot * logp).sum() / n
        d = (np.exp(logp) - onehot) / n  # dL/dz
        ds = (d * lp).sum(axis=0)
        g_s = np.array([ds.sum()]) if shared_scale else ds
        g_b = d.sum(axis=0)[:nb]
        value += ridge * (((theta[:ns] - 1) ** 2).sum() + (theta[ns:] ** 2).sum())
        grad = np.concatenate([g_s + 2 * ridge * (theta[:ns] - 1), g_b + 2 * ridge * theta[ns:]])
        return float(value), grad

    theta0 = np.concatenate([np.ones(ns), np.zeros(nb)])
    res = minimize(loss, theta0, jac=True, method="L-BFGS-B")
    return unpack(res.x)


def _fit_platt_binary(lp: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Platt (1999): logistic regression of "the first choice is right" on ``l_1 - l_2``."""
    from sklearn.linear_model import LogisticRegression

    x = (lp[:, 0] - lp[:, 1])[:, None]
    target = (y == 0).astype(int)
    lr = LogisticRegression(C=1e4).fit(x, target)  # nearly unpenalised; finite on separable rows
    a, c = float(lr.coef_[0, 0]), float(lr.intercept_[0])
    return np.array([a, a]), np.array([c, 0.0])


def _fit_matrix(lp: np.ndarray, y: np.ndarray, choices: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Matrix scaling / Dirichlet calibration: multinomial logistic regression of the right choice
    on the ``k`` logprobs, its L2 strength ``C`` chosen from a log grid by the inner
    cross-validated log loss (scikit-learn ``LogisticRegressionCV``). Returns ``W [k, k]``, ``b [k]``."""
    from sklearn.linear_model import LogisticRegression, LogisticRegressionCV

    k = lp.shape[1]
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < k:
        missing = sorted(set(range(k)) - set(classes.tolist()))
        named = [choices[j] for j in missing] if choices is not None else missing
        raise ValueError(f"matrix scaling needs labelled rows of every choice; choices {named} have none (use vector)")
    inner = min(5, int(counts.min()))
    with warnings.catch_warnings():  # scikit-learn 1.8 announces attribute and default changes we do not rely on
        warnings.simplefilter("ignore", FutureWarning)
        if inner >= 2:
            lr = LogisticRegressionCV(Cs=np.logspace(-2, 3, 6), cv=inner, scoring="neg_log_loss", max_iter=5000).fit(lp, y)
        else:
            lr = LogisticRegression(C=1.0, max_iter=5000).fit(lp, y)
    if k == 2:  # one row of coefficients: the log-odds of the second class
        w = np.zeros((2, 2))
        w[1] = lr.coef_[0]
        b = np.array([0.0, float(lr.intercept_[0])])
        return w, b
    return np.asarray(lr.coef_, dtype=np.float64), np.asarray(lr.intercept_, dtype=np.float64)


def fit_question(method: str, lp: np.ndarray, y: np.ndarray, choices: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``(scale, bias)`` of ``method`` (not ``contextual``) on labelled rows: float64 ``[k]``
    each, except ``matrix``, whose first element is the ``[k, k]`` matrix.

    Args:
        lp: raw choice logprobs, float64 ``[n, k]``. y: index of the right choice, int ``[n]``.
        choices: the choices' labels, to name them in errors.
    Raises:
        ValueError: an unknown method, ``contextual`` (see :func:`contextual_question`), or
            ``matrix`` on rows that never label one of the choices.
    """
    k = lp.shape[1]
    if method == "matrix":
        return _fit_matrix(lp, y, choices)
    if method == "temperature":
        return _fit_affine(lp, y, shared_scale=True, with_bias=False)
    if method == "vector":
        return _fit_affine(lp, y, shared_scale=False, with_bias=True)
    if method == "platt":
        if k == 2 and len(np.unique(y)) == 2:
            return _fit_platt_binary(lp, y)
        return _fit_affine(lp, y, shared_scale=True, with_bias=True)
    raise ValueError(f"method {method!r} is not fitted on labels (methods: {', '.join(METHODS)})")


def contextual_question(content_free_lp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zhao et al. 2021: ``p_cf`` = mean over content-free inputs of the choice probabilities
    (softmax of their logprobs, ``[m, k]``); ``scale = 1``, ``bias = -log p_cf``."""
    p_cf = softmax(content_free_lp).mean(axis=0)
    k = content_free_lp.shape[1]
    return np.ones(k), -np.log(p_cf)


@dataclass(frozen=True)
class CrossValidated:
    """Out-of-fold calibrated probabilities ``[n, k]`` and answers ``[n]`` of one question."""

    probabilities: np.ndarray
    answers: np.ndarray
    folds: int


def question_map(scale: np.ndarray, bias: np.ndarray, choices: Sequence[str], threshold: float | None) -> QuestionCalibration:
    """A :class:`QuestionCalibration` from fitted arrays: ``scale`` ``[k]``, or ``[k, k]`` for a matrix."""
    weights = np.asarray(scale, dtype=np.float64)
    as_tuple = (lambda a: tuple(float(x) for x in a))
    return QuestionCalibration(
        choices=tuple(choices),
        scale=as_tuple(weights) if weights.ndim == 1 else None,
        matrix=tuple(as_tuple(row) for row in weights) if weights.ndim == 2 else None,
        bias=as_tuple(bias), threshold=threshold if len(choices) == 2 else None,
    )


def prior_question(y: np.ndarray, k: int, matrix: bool) -> tuple[np.ndarray, np.ndarray]:
    """The map of a question without signal: every weight 0 (``[k]``, or ``[k, k]`` when
    ``matrix``) and ``bias_j = log((n_j + 1) / (n + k))``, the class frequencies of the rows with
    one pseudo-count each (Laplace), so every message gets the class prior whatever its logprobs
    and a choice no row labels keeps a finite bias."""
    counts = np.bincount(y, minlength=k).astype(np.float64)
    weights = np.zeros((k, k)) if matrix else np.zeros(k)
    return weights, np.log((counts + 1) / (len(y) + k))


def fit_map(method: str, lp: np.ndarray, y: np.ndarray, choices: Sequence[str], target: str,
            content_free_lp: np.ndarray | None = None, prior: bool = False) -> QuestionCalibration:
    """The question's map fitted on these rows, with its threshold for ``target`` (binary only);
    with ``prior``, the class prior's map (:func:`prior_question`, in the method's form) and no
    threshold (the answer is the most frequent choice)."""
    if prior:
        weights, bias = prior_question(y, len(choices), matrix=method == "matrix")
        return question_map(weights, bias, choices, None)
    if method == "contextual":
        if content_free_lp is None:
            raise ValueError("contextual calibration needs the content-free inputs' logprobs")
        scale, bias = contextual_question(content_free_lp)
    else:
        scale, bias = fit_question(method, lp, y, choices)
    threshold = None
    if len(choices) == 2:
        p = question_map(scale, bias, choices, None).apply(lp)
        threshold = choose_threshold(p[:, 0], y == 0, target)
    return question_map(scale, bias, choices, threshold)


def cross_validate(method: str, lp: np.ndarray, y: np.ndarray, choices: Sequence[str], target: str, folds: int,
                   content_free_lp: np.ndarray | None = None, seed: int = 0, prior: bool = False) -> CrossValidated | None:
    """k-fold cross-validation (stratified, shuffled with ``seed``): each row's calibrated
    probabilities and answer come from a map (and threshold) fitted on the other folds only
    (``prior``: :func:`fit_map`'s prior map of the other folds).

    Uses ``min(folds, rows of the rarest choice present)`` folds; ``None`` when that is below 2.
    """
    from sklearn.model_selection import StratifiedKFold

    _, counts = np.unique(y, return_counts=True)
    n_folds = min(folds, int(counts.min()))
    if n_folds < 2 or len(counts) < 2:
        return None
    probs = np.zeros_like(lp)
    answers = np.zeros(len(y), dtype=int)
    for train, test in StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed).split(lp, y):
        qc = fit_map(method, lp[train], y[train], choices, target, content_free_lp, prior)
        probs[test] = qc.apply(lp[test])
        answers[test] = qc.answers(probs[test])
    return CrossValidated(probs, answers, n_folds)


def build(pack: Pack, model: ModelIdentity, method: str, target: str, maps: dict[str, QuestionCalibration],
          content_free: Sequence[str] | None = None, fitted_on: FittedOn | None = None) -> Calibration:
    """A :class:`Calibration` of ``pack`` (its file's identity) for ``model``, with its content id."""
    order = [q.id for q in pack.expand() if q.id in maps]
    return Calibration(
        pack=pack_identity(pack), model=model, method=method, target=target,  # type: ignore[arg-type]
        content_free=tuple(content_free) if content_free is not None else None,
        fitted_on=fitted_on or FittedOn(), questions={qid: maps[qid] for qid in order},
    )
