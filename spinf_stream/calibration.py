"""Calibration of a pack's answers: a per-question affine map of the choices' logprobs, fixed per
pack and model, fitted offline and applied to every message alike.

For question *q* with choices ``c_1..c_k`` and the engine's raw logprobs ``l_1..l_k`` (natural
log, full vocabulary), a calibration gives ``scale_j`` and ``bias_j`` and

    calibrated_j = softmax_j(scale_j * l_j + bias_j)

or, for ``matrix``, a ``[k, k]`` matrix ``W`` in place of the scales:

    calibrated_j = softmax_j(sum_i W[j][i] * l_i + bias_j)

Methods (all of this form, so applying one costs a few flops per choice and no forward pass):

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
  choice's logprob move another's probability: on a 10-choice question it fits where a
  diagonal map cannot (product_category: cross-validated log loss 0.715 → 0.56).

Never batch calibration (estimating a bias from the current batch): a message's score must not
depend on its neighbours (``DESIGN.md``, "Decisions users can act on").

A binary question may also carry a ``threshold``: the answer is the first choice iff its
calibrated probability is at least the threshold (``None``: the most probable choice).

The calibration file (``CAL.json``, :class:`Calibration`) names the pack (name, version, sha256
of its file) and the model (name, sha256 of its weights); :func:`check` refuses it for another
pack file or model.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, ValidationError, model_validator

from .packs import ExpandedQuestion, Pack

if TYPE_CHECKING:
    from .models.weights import ResolvedModel

log = logging.getLogger(__name__)

Method = Literal["contextual", "temperature", "vector", "platt", "matrix"]
METHODS: tuple[str, ...] = ("contextual", "temperature", "vector", "platt", "matrix")
FORMAT = "spinf-stream.calibration/1"
#: Content-free inputs of contextual calibration (Zhao et al. 2021 use "N/A", "" and "[MASK]";
#: an empty field is not a valid message here, so a third neutral string takes its place).
CONTENT_FREE = ("N/A", "[MASK]", "None")
#: the forms of a decision target (``calibrate --target``)
TARGET_PATTERN = r"^(accuracy|f1|(precision|recall)=(0(\.\d+)?|1(\.0+)?))$"
_TARGET = re.compile(TARGET_PATTERN)
#: Largest |parameter| a map may hold: fitted maps stay far below it (the fits are L2-penalised),
#: and a larger one would overflow the affine map of a logprob into inf or NaN.
MAX_PARAMETER = 1e6


class CalibrationError(ValueError):
    """A calibration that cannot be used: unreadable, invalid, or for another pack or model."""


# ------------------------------------------------------------------------------------ the file


class PackIdentity(BaseModel):
    """The pack a calibration belongs to: its name, version and the sha256 of its file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    version: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class ModelIdentity(BaseModel):
    """The model a calibration belongs to: the name it was given and the sha256 of its weights
    (``spinf_stream.models.weights.ResolvedModel.weights_sha256``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class QuestionCalibration(BaseModel):
    """One question's map: ``calibrated_j = softmax_j(scale[j] * logprob[j] + bias[j])``, or with
    ``matrix`` (``[k][k]``, in place of ``scale``) ``softmax_j(sum_i matrix[j][i] * logprob[i] + bias[j])``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    choices: tuple[str, ...] = Field(min_length=2)
    # strict: a quoted "1.5" or a true in a hand-edited file is a mistake, not a number
    scale: tuple[StrictFloat, ...] | None = None
    matrix: tuple[tuple[StrictFloat, ...], ...] | None = None
    bias: tuple[StrictFloat, ...]
    threshold: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Binary questions: answer the first choice iff its calibrated probability >= threshold; "
        "null: the most probable choice.",
    )

    @model_validator(mode="after")
    def _lengths(self) -> QuestionCalibration:
        k = len(self.choices)
        if (self.scale is None) == (self.matrix is None):
            raise ValueError("a map has either scale (one number per choice) or matrix (k rows of k numbers), not both or neither")
        if self.matrix is not None:
            if len(self.matrix) != k or any(len(row) != k for row in self.matrix):
                raise ValueError(f"matrix needs {k} rows of {k} numbers (one per choice)")
            weights = [x for row in self.matrix for x in row]
        else:
            assert self.scale is not None
            if len(self.scale) != k:
                raise ValueError(f"scale needs one number per choice ({k}), got {len(self.scale)}")
            weights = list(self.scale)
        if len(self.bias) != k:
            raise ValueError(f"bias needs one number per choice ({k}), got {len(self.bias)}")
        if not all(math.isfinite(x) and abs(x) <= MAX_PARAMETER for x in (*weights, *self.bias)):
            raise ValueError(f"scale, matrix and bias must be finite numbers of magnitude at most {MAX_PARAMETER:g}")
        if self.threshold is not None and k != 2:
            raise ValueError("a threshold is only defined for a question with two choices")
        return self

    def probabilities(self, logprobs: Sequence[float]) -> list[float]:
        """Calibrated probabilities (float64, sum 1) from one message's choice logprobs.

        Plain Python floats in a fixed order (``math.fsum``), so the same logprobs always give
        the same bits, whatever else is scored.
        """
        if self.matrix is not None:
            z = [math.fsum(w * lp for w, lp in zip(row, logprobs)) + b for row, b in zip(self.matrix, self.bias)]
        else:
            assert self.scale is not None
            z = [s * lp + b for s, lp, b in zip(self.scale, logprobs, self.bias)]
        top = max(z)
        e = [math.exp(x - top) for x in z]
        total = math.fsum(e)
        return [x / total for x in e]

    def answer(self, probabilities: Sequence[float]) -> int:
        """Index of the answer: the threshold rule for a binary question that has one, else the
        most probable choice (the first of equals)."""
        if self.threshold is not None:
            return 0 if probabilities[0] >= self.threshold else 1
        return max(range(len(probabilities)), key=lambda j: probabilities[j])

    def apply(self, logprobs: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`probabilities`: ``logprobs`` float64 ``[n, k]`` → ``[n, k]``."""
        if self.matrix is not None:
            z = logprobs @ np.asarray(self.matrix).T + np.asarray(self.bias)
        else:
            z = logprobs * np.asarray(self.scale) + np.asarray(self.bias)
        z -= z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def answers(self, probabilities: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`answer`: ``[n, k]`` → int ``[n]``."""
        if self.threshold is not None:
            return np.where(probabilities[:, 0] >= self.threshold, 0, 1)
        return probabilities.argmax(axis=1)


class FittedOn(BaseModel):
    """Where the parameters came from (for the record; not checked)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input_sha256: str | None = None
    rows: dict[str, int] = Field(default_factory=dict, description="Labelled rows per question.")


class Calibration(BaseModel):
    """A calibration file (``CAL.json``): one pack version, one model, per-question maps."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["spinf-stream.calibration/1"] = FORMAT
    id: str = Field("", description="'<pack>@<version>/<method>/<12 hex of the content's sha256>'")
    pack: PackIdentity
    model: ModelIdentity
    method: Method
    target: str = "accuracy"
    content_free: tuple[str, ...] | None = None
    fitted_on: FittedOn = Field(default_factory=FittedOn)
    questions: dict[str, QuestionCalibration]

    @model_validator(mode="after")
    def _id(self) -> Calibration:
        for qid, qc in self.questions.items():
            if (qc.matrix is not None) != (self.method == "matrix"):
                form = "a matrix" if qc.matrix is not None else "scale"
                raise ValueError(f"questions.{qid}: method {self.method!r} with {form}: matrix maps belong to method 'matrix' only")
        want = self.content_id()
        if self.id == "":
            object.__setattr__(self, "id", want)
        elif self.id != want:
            raise ValueError(f"id {self.id!r} does not match the file's content ({want!r}): the file was edited")
        return self

    def content_id(self) -> str:
        body = self.model_dump(mode="json", exclude={"id"})
        h = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
        return f"{self.pack.name}@{self.pack.version}/{self.method}/{h[:12]}"

    def to_json(self) -> bytes:
        """The file's bytes (indented, sorted keys, trailing newline)."""
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"

    def bind(self, questions: Sequence[ExpandedQuestion]) -> list[QuestionCalibration | None]:
        """The map of each of the pack's questions, in pack order (``None``: not calibrated).

        Raises:
            CalibrationError: the calibration names a question the pack lacks, or other choices.
        """
        by_id = {q.id: q for q in questions}
        for qid, qc in self.questions.items():
            if qid not in by_id:
                raise CalibrationError(f"calibration {self.id}: question {qid!r} is not in pack {self.pack.name!r}")
            if tuple(by_id[qid].choices) != qc.choices:
                raise CalibrationError(
                    f"calibration {self.id}: question {qid!r} has choices {list(qc.choices)}, "
                    f"the pack has {list(by_id[qid].choices)}"
                )
        return [self.questions.get(q.id) for q in questions]


def load(path: str | Path) -> Calibration:
    """Read and validate a calibration file. Raises :class:`CalibrationError` naming the file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise CalibrationError(f"cannot read calibration {p}: {e.strerror or e}") from None
    try:
        return Calibration.model_validate_json(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "top level"
        raise CalibrationError(f"invalid calibration {p}: {where}: {first['msg']} ({e.error_count()} problem(s))") from None


# ----------------------------------------------------------------------------- identities, check


def pack_identity(pack: Pack) -> PackIdentity:
    """Name, version and sha256 of the pack's file (of its canonical JSON when built in memory)."""
    if pack.source is not None:
        digest = hashlib.sha256(Path(pack.source).read_bytes()).hexdigest()
    else:
        digest = hashlib.sha256(orjson.dumps(pack.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)).hexdigest()
    return PackIdentity(name=pack.name, version=pack.version, sha256=digest)


def model_identity(model: ResolvedModel) -> ModelIdentity:
    """Name and weights sha256 of a resolved model (reads the weights once: ~1 s per GB)."""
    return ModelIdentity(name=model.name, weights_sha256=model.weights_sha256)


def check(cal: Calibration, pack: PackIdentity, model: ModelIdentity | None) -> None:
    """Raise :class:`CalibrationError` unless ``cal`` was made for this pack file and these weights
    (``model=None``: the pack only, as the checks before the weights load do)."""
    if (cal.pack.name, cal.pack.version, cal.pack.sha256) != (pack.name, pack.version, pack.sha256):
        raise CalibrationError(
            f"calibration {cal.id} is for pack {cal.pack.name} {cal.pack.version} (file sha256 {cal.pack.sha256[:12]}…), "
            f"not {pack.name} {pack.version} (file sha256 {pack.sha256[:12]}…); "
            "recalibrate with `spinf-stream calibrate` or pass --calibration none"
        )
    if model is not None and cal.model.weights_sha256 != model.weights_sha256:
        raise CalibrationError(
            f"calibration {cal.id} is for model {cal.model.name} (weights sha256 {cal.model.weights_sha256[:12]}…), "
            f"not {model.name} (weights sha256 {model.weights_sha256[:12]}…); "
            "recalibrate with `spinf-stream calibrate` or pass --calibration none"
        )


def shipped_path(pack: Pack, model_name: str) -> Path | None:
    """Where the shipped calibration of ``pack`` for ``model_name`` lives: beside the pack file,
    ``<dir>/<pack file stem>/calibrations/<model name>.json`` (``None`` for an in-memory pack or a
    model given by path)."""
    if pack.source is None or "/" in model_name or model_name.startswith("."):
        return None
    src = Path(pack.source)
    return src.parent / src.stem / "calibrations" / f"{model_name}.json"


def resolve(ref: str | Path | Calibration | None, pack: Pack, model: ResolvedModel) -> Calibration | None:
    """The calibration to score with: ``none``/``None`` → none; ``auto`` → the shipped one for
    this pack and model if there is one and it matches (else none, with a warning when one exists
    but is stale); a path → that file, checked.

    Raises:
        CalibrationError: an explicit file that is unreadable, invalid, or for another pack or model.
    """
    if ref is None or (isinstance(ref, str) and ref == "none"):
        return None
    if isinstance(ref, str) and ref == "auto":
        path = shipped_path(pack, model.name)
        if path is None or not path.is_file():
            return None
        cal = load(path)
        try:
            check(cal, pack_identity(pack), model_identity(model))
        except CalibrationError as e:
            log.warning("not using the shipped calibration %s: %s", path, e)
            return None
        return cal
    cal = ref if isinstance(ref, Calibration) else load(ref)
    check(cal, pack_identity(pack), model_identity(model))
    return cal


# --------------------------------------------------------------------------------------- fitting


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


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


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
    p_cf = _softmax(content_free_lp).mean(axis=0)
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


def fit_map(method: str, lp: np.ndarray, y: np.ndarray, choices: Sequence[str], target: str,
            content_free_lp: np.ndarray | None = None) -> QuestionCalibration:
    """The question's map fitted on these rows, with its threshold for ``target`` (binary only)."""
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
                   content_free_lp: np.ndarray | None = None, seed: int = 0) -> CrossValidated | None:
    """k-fold cross-validation (stratified, shuffled with ``seed``): each row's calibrated
    probabilities and answer come from a map (and threshold) fitted on the other folds only.

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
        qc = fit_map(method, lp[train], y[train], choices, target, content_free_lp)
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
