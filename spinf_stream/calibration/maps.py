"""The calibration file and its maps at serve time: read, check against the pack and model, bind, apply.

For question *q* with choices ``c_1..c_k`` and the engine's raw logprobs ``l_1..l_k`` (natural
log, full vocabulary), a map gives ``scale_j`` and ``bias_j`` and

    calibrated_j = softmax_j(scale_j * l_j + bias_j)

or, for ``matrix``, a ``[k, k]`` matrix ``W`` in place of the scales:

    calibrated_j = softmax_j(sum_i W[j][i] * l_i + bias_j)

(the methods that fit them: :mod:`spinf_stream.calibration.fit`). A binary question may also
carry a ``threshold``: the answer is the first choice iff its calibrated probability is at least
the threshold (``None``: the most probable choice).

An extraction question with a none word may have a map too, of its two "choices"
:data:`NONE_CHOICES` (``none``, ``value``) with :func:`none_features` of its raw
``none_probability`` as their logprobs: the engine then decides at the first decode step whether
to answer none by the map's answer, and writes the best value otherwise (``docs/extraction.md``).

The calibration file (``CAL.json``, :class:`Calibration`) names the pack (name, version, sha256
of its file) and the model (name, sha256 of its weights); :func:`check` refuses it for another
pack file or model.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, ValidationError, model_validator

from spinf_stream.packs import ExpandedQuestion, Pack
from spinf_stream.softmax import softmax, softmax_row

if TYPE_CHECKING:
    from spinf_stream.models.resolve import ResolvedModel

log = logging.getLogger(__name__)

Method = Literal["contextual", "temperature", "vector", "platt", "matrix"]
METHODS: tuple[str, ...] = ("contextual", "temperature", "vector", "platt", "matrix")
FORMAT = "spinf-stream.calibration/1"
#: Largest |parameter| a map may hold: fitted maps stay far below it (the fits are L2-penalised),
#: and a larger one would overflow the affine map of a logprob into inf or NaN.
MAX_PARAMETER = 1e6


#: the two "choices" of an extraction question's none map
NONE_CHOICES = ("none", "value")
#: how far from 0 and 1 :func:`none_features` keeps a probability (its logs stay finite)
NONE_EPS = 1e-12


def none_features(p: float) -> list[float]:
    """The logprobs a none map reads: ``[log p, log(1 - p)]`` of the raw ``none_probability``
    ``p`` clamped into ``[NONE_EPS, 1 - NONE_EPS]`` (float64)."""
    q = min(max(p, NONE_EPS), 1.0 - NONE_EPS)
    return [math.log(q), math.log1p(-q)]


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
    (``spinf_stream.models.resolve.ResolvedModel.weights_sha256``)."""

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

        Plain Python floats in a fixed order (``math.fsum``, :func:`spinf_stream.softmax.softmax_row`),
        so the same logprobs always give the same bits, whatever else is scored.
        """
        if self.matrix is not None:
            z = [math.fsum(w * lp for w, lp in zip(row, logprobs)) + b for row, b in zip(self.matrix, self.bias)]
        else:
            assert self.scale is not None
            z = [s * lp + b for s, lp, b in zip(self.scale, logprobs, self.bias)]
        return softmax_row(z)

    def answer(self, probabilities: Sequence[float]) -> int:
        """Index of the answer: the threshold rule for a binary question that has one, else the
        most probable choice (the first of equals)."""
        if self.threshold is not None:
            return 0 if probabilities[0] >= self.threshold else 1
        return max(range(len(probabilities)), key=lambda j: probabilities[j])

    def apply(self, logprobs: np.ndarray) -> np.ndarray:
        """:meth:`probabilities` of each row: ``logprobs`` float64 ``[n, k]`` → ``[n, k]``; the same
        bits for a ``scale`` map, while a ``matrix`` map's product is numpy's (``@``) here, so its
        last bits may differ."""
        if self.matrix is not None:
            z = logprobs @ np.asarray(self.matrix).T + np.asarray(self.bias)
        else:
            z = logprobs * np.asarray(self.scale) + np.asarray(self.bias)
        return softmax(z)

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
    row_keys: tuple[str, ...] | None = Field(
        None, exclude_if=lambda v: v is None,
        description="row_key of each row fitted on, sorted: evaluate warns when it measures any of them (in-sample).",
    )


def row_key(pack: Pack, fields: Mapping[str, Any]) -> str:
    """16 hex of the sha256 of the pack's fields of a message (sorted-key JSON): which labelled
    rows a calibration was fitted on, without keeping their text."""
    body = {name: fields.get(name) for name in pack.fields}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


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
        """The map of each of the pack's questions, in pack order (``None``: not calibrated); an
        extraction question's is its none map.

        Raises:
            CalibrationError: the calibration names a question the pack lacks, or other choices.
        """
        by_id = {q.id: q for q in questions}
        for qid, qc in self.questions.items():
            if qid not in by_id:
                raise CalibrationError(f"calibration {self.id}: question {qid!r} is not in pack {self.pack.name!r}")
            x = by_id[qid].extract
            if x is not None:
                if x.none is None or qc.choices != NONE_CHOICES:
                    raise CalibrationError(
                        f"calibration {self.id}: question {qid!r} is an extraction; its map must be of choices "
                        f"{list(NONE_CHOICES)} and the question must have a none word"
                    )
                continue
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


#: a shipped variant's name (``--calibration recall95``): a folder of ``calibrations/``
VARIANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def _calibrations_dir(pack: Pack) -> Path | None:
    if pack.source is None:
        return None
    src = Path(pack.source)
    return src.parent / src.stem / "calibrations"


def shipped_path(pack: Pack, model_name: str, variant: str | None = None) -> Path | None:
    """Where the shipped calibration of ``pack`` for ``model_name`` lives: beside the pack file,
    ``<dir>/<pack file stem>/calibrations/<model name>.json``, or for a named variant
    ``calibrations/<variant>/<model name>.json`` (``None`` for an in-memory pack or a model given
    by path)."""
    where = _calibrations_dir(pack)
    if where is None or "/" in model_name or model_name.startswith("."):
        return None
    return (where / variant if variant else where) / f"{model_name}.json"


def shipped_variants(pack: Pack) -> list[str]:
    """The named calibrations shipped beside the default ones (folders of ``calibrations/``), sorted."""
    where = _calibrations_dir(pack)
    if where is None or not where.is_dir():
        return []
    return sorted(d.name for d in where.iterdir() if d.is_dir() and VARIANT_NAME.match(d.name))


def variant_of(ref: str, pack: Pack) -> str | None:
    """The shipped variant ``ref`` names (``recall95``, or with the pack's name: ``spam-recall95``),
    or ``None`` when ``ref`` is no such name (then it is a file)."""
    if Path(ref).exists() or not VARIANT_NAME.match(ref):
        return None
    variants = shipped_variants(pack)
    for name in (ref, ref.removeprefix(f"{pack.name}-")):
        if name in variants:
            return name
    return None


def decision_rule(qc: QuestionCalibration, cal: Calibration) -> str | None:
    """The record's ``rule`` for a question whose answer a threshold decides (``None`` otherwise):
    ``"yes if calibrated[yes] >= 0.240 (recall=0.95 on spam@1.3.0 rows)"``."""
    if qc.threshold is None:
        return None
    first = qc.choices[0]
    return f"{first} if calibrated[{first}] >= {qc.threshold:.3f} ({cal.target} on {cal.pack.name}@{cal.pack.version} rows)"


def resolve(ref: str | Path | Calibration | None, pack: Pack, model: ResolvedModel) -> Calibration | None:
    """The calibration to score with: ``none``/``None`` → none; ``auto`` → the shipped one for
    this pack and model if there is one and it matches (else none, with a warning when one exists
    but is stale); a shipped variant's name (:func:`variant_of`) → its file for this model; a
    path → that file, checked.

    Raises:
        CalibrationError: an explicit file that is unreadable, invalid, or for another pack or
            model; a variant the pack does not ship for this model.
    """
    if ref is None or (isinstance(ref, str) and ref == "none"):
        return None
    variant = variant_of(ref, pack) if isinstance(ref, str) else None
    if variant is not None:
        path = shipped_path(pack, model.name, variant)
        if path is None or not path.is_file():
            raise CalibrationError(f"pack {pack.name} ships no {variant!r} calibration for model {model.name}")
        cal = load(path)
        check(cal, pack_identity(pack), model_identity(model))
        return cal
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
