"""Calibration of a pack's answers: per-question maps of the choices' logprobs, fixed per pack and model.

- ``maps``: the calibration file and its maps at serve time (load, check, bind, apply); what the
  engine and the service use.
- ``fit``: fitting the maps on labelled rows (scipy, scikit-learn); what ``calibrate`` uses.

Every name of both is importable from here; those of ``fit`` are imported on first use, so
scoring with a calibration never imports the fitting code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spinf_stream.calibration.maps import (
    FORMAT,
    MAX_PARAMETER,
    METHODS,
    NONE_CHOICES,
    Calibration,
    CalibrationError,
    FittedOn,
    Method,
    ModelIdentity,
    PackIdentity,
    VARIANT_NAME,
    QuestionCalibration,
    check,
    decision_rule,
    load,
    model_identity,
    none_features,
    pack_identity,
    resolve,
    row_key,
    shipped_path,
    shipped_variants,
    variant_of,
)

if TYPE_CHECKING:
    from spinf_stream.calibration.fit import (
        CONTENT_FREE,
        TARGET_PATTERN,
        CrossValidated,
        build,
        choose_threshold,
        contextual_question,
        cross_validate,
        fit_map,
        fit_question,
        parse_target,
        question_map,
    )

_FIT = (
    "CONTENT_FREE", "TARGET_PATTERN", "CrossValidated", "build", "choose_threshold", "contextual_question",
    "cross_validate", "fit_map", "fit_question", "parse_target", "question_map",
)

__all__ = [
    "FORMAT", "MAX_PARAMETER", "METHODS", "NONE_CHOICES", "Calibration", "CalibrationError", "FittedOn", "Method", "ModelIdentity",
    "PackIdentity", "QuestionCalibration", "check", "load", "model_identity", "none_features", "pack_identity", "resolve",
    "shipped_path", "shipped_variants", "VARIANT_NAME", "row_key", "variant_of", "decision_rule",
    "CONTENT_FREE", "TARGET_PATTERN", "CrossValidated", "build", "choose_threshold", "contextual_question",
    "cross_validate", "fit_map", "fit_question", "parse_target", "question_map",
]


def __getattr__(name: str) -> Any:
    if name in _FIT:
        from spinf_stream.calibration import fit

        return getattr(fit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
