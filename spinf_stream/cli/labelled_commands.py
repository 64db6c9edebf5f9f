"""The ``evaluate`` and ``calibrate`` command lines (cheap to import).

The work is in :mod:`spinf_stream.cli.evaluation`. Importing this module is cheap (no torch, no
scikit-learn): the CLI builds its parser from it and checks the pack, the files and the model
reference before anything slow is loaded.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from spinf_stream import calibration as cal
from spinf_stream.config import (
    DType,
    allow_unstable_bits_field,
    calibration_field,
    device_field,
    dtype_field,
    model_field,
    pack_field,
    plain,
    settings_config,
    token_budget_field,
)
from spinf_stream.errors import UsageError
from spinf_stream.packs import Pack

if TYPE_CHECKING:
    from spinf_stream.cli.evaluation import ModelHandle, Scored


class _Common(BaseSettings):
    model_config = settings_config()

    pack: str = pack_field()
    model: str = model_field()
    input: str = Field(
        description='Labelled JSON Lines: the message\'s fields plus "labels": {question id: choice label, or the value an '
        'extraction question should give (null: none)}.',
        json_schema_extra=plain("FILE"),
    )
    report: str | None = Field(default=None, description="Write the report (JSON) here.", json_schema_extra=plain("FILE"))
    plots: str | None = Field(
        default=None, description="Write a reliability diagram and a score histogram per question (PNG) into this folder.",
        json_schema_extra=plain("DIR"),
    )
    cache: str | None = Field(
        default=None, description="Folder that keeps raw logprobs per (row, question), so a rerun never rescores them.",
        json_schema_extra=plain("DIR"),
    )
    token_budget: int = token_budget_field()
    device: str = device_field()
    dtype: DType = dtype_field()
    allow_unstable_bits: bool = allow_unstable_bits_field()
    progress: bool = Field(default=True, description="Progress bar on stderr.")
    labelled_only: bool = Field(
        default=False, description="Score each row with only the questions the rows label (a sub-pack of them): a pack of "
        "many questions reads many times faster; its numbers may differ from the whole pack's in the last bits.")
    limit: int | None = Field(default=None, ge=1, description="Use only the first N labelled rows.")
    sample: int | None = Field(default=None, ge=1, description="Use N labelled rows drawn at random (with --seed), in file order.")
    seed: int = Field(default=0, description="Seed of --sample.")

    def _preflight(self) -> tuple[Pack, ModelHandle]:
        """Pack, input and model reference checked in milliseconds, then the model resolved."""
        from . import preflight
        from spinf_stream.device import choose
        from spinf_stream.cli.evaluation import ModelHandle

        pack = preflight.check_pack(self.pack)
        preflight.check_input_file(self.input, "--input", "SPINF_INPUT")
        preflight.check_calibration(getattr(self, "calibration", "none"), pack)
        preflight.check_model_reference(self.model)
        placement = choose(self.device, self.dtype)
        return pack, ModelHandle(self.model, placement.dtype, placement.device, allow_unstable_bits=self.allow_unstable_bits)

    def _rows(self, pack: Pack) -> list[Any]:
        """The labelled rows, less those --limit or --sample leave out (file order kept)."""
        import random

        from spinf_stream.cli.evaluation import read_rows

        rows = read_rows(pack, self.input).rows
        if self.limit is not None and self.sample is not None:
            from spinf_stream.errors import UsageError

            raise UsageError("--limit and --sample select rows two ways: give one of them")
        if self.limit is not None:
            rows = rows[: self.limit]
        if self.sample is not None and self.sample < len(rows):
            keep = set(random.Random(self.seed).sample(range(len(rows)), self.sample))
            rows = [r for i, r in enumerate(rows) if i in keep]
        if self.limit is not None or self.sample is not None:
            print(f"{self.input}: using {len(rows)} of the labelled rows", file=sys.stderr)
        return rows

    def _score(self, pack: Pack, handle: ModelHandle, calibration: cal.Calibration | None = None,
               rows: list[Any] | None = None) -> Scored:
        from spinf_stream.cli.evaluation import LogprobCache, report_failed, score_labelled

        rows = self._rows(pack) if rows is None else rows
        cache = LogprobCache(self.cache, handle.cache_key())
        scored = score_labelled(handle, pack, rows, cache, token_budget=self.token_budget, progress=self.progress,
                                calibration=calibration, labelled_only=self.labelled_only)
        report_failed(scored.failed)
        if not scored.questions and not scored.extractions:
            raise cal.CalibrationError(f"{self.input}: no labelled row could be scored")
        return scored


class EvaluateCommand(_Common):
    """Measure a pack on labelled rows: per labelled question AUC, accuracy, macro-F1, log loss,
    Brier and ECE, raw and with the calibration, against the majority baseline; per labelled
    extraction question exact match, none accuracy and the ECE of its probability."""

    report: str = Field(description="Write the report (JSON) here.", json_schema_extra=plain("FILE"))  # type: ignore[assignment]
    calibration: str = calibration_field()
    strict: bool = Field(default=False, description="Refuse to measure a calibration on rows it was fitted on "
                         "(an error, not a warning).")

    def _in_sample(self, pack: Pack, chosen: cal.Calibration, rows: list[Any]) -> str | None:
        """Why these rows' calibrated numbers are in-sample, or None: the calibration was fitted on
        some of them (its row keys) or on this very file (its sha256, for files without row keys)."""
        keys = chosen.fitted_on.row_keys
        if keys is not None:
            fitted = set(keys)
            n = sum(cal.row_key(pack, r.message.fields) in fitted for r in rows)
            if n:
                return f"{n} of the {len(rows)} rows were used to fit calibration {chosen.id}"
            return None
        with open(self.input, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
        if chosen.fitted_on.input_sha256 == sha:
            return f"calibration {chosen.id} was fitted on this file (sha256 {sha[:12]}…)"
        return None

    def cli_cmd(self) -> None:
        from spinf_stream.cli.evaluation import question_report, report, summary, write_json
        from spinf_stream.softmax import softmax

        pack, handle = self._preflight()
        chosen = cal.resolve(self.calibration, pack, handle.resolved)
        if chosen is not None:
            chosen.bind(pack.expand())
        rows = self._rows(pack)
        warnings = []
        why = self._in_sample(pack, chosen, rows) if chosen is not None else None
        if why is not None:
            text = f"{why}: its calibrated numbers on them are in-sample (optimistic); measure it on other rows"
            if self.strict:
                raise cal.CalibrationError(f"--strict: {text}")
            print(f"warning: {text}", file=sys.stderr)
            warnings.append(text)
        scored = self._score(pack, handle, chosen, rows)  # its none maps decide the extractions' none answers
        entries: dict[str, Any] = {}
        for qid, d in scored.questions.items():
            qmap = chosen.questions.get(qid) if chosen else None
            calibrated = None
            if qmap is not None:
                p = qmap.apply(d.logprobs)
                calibrated = (p, qmap.answers(p))
            entries[qid] = question_report(d, calibrated)
            if self.plots:
                from spinf_stream.plots import question_plots

                question_plots(self.plots, qid, d.question.choices, d.y, softmax(d.logprobs),
                               calibrated[0] if calibrated else None, chosen.id if chosen else "")
        doc = report(pack, handle.name, chosen.id if chosen else None, entries, scored.extractions)
        doc["warnings"] = warnings
        write_json(self.report, doc)
        print(summary(doc), file=sys.stderr)


class CalibrateCommand(_Common):
    """Fit a pack's calibration on labelled rows (per question: a map of the choices' logprobs and,
    for two choices, a decision threshold; per extraction question labelled with and without
    values: a map of its none decision); report k-fold cross-validated metrics."""

    output: str = Field(description="Write the calibration (CAL.json) here.", json_schema_extra=plain("FILE"))
    method: Literal["contextual", "temperature", "vector", "platt", "matrix"] = Field(
        default="platt",
        description="contextual (content-free inputs, no labels), temperature, vector, platt or matrix (fitted on the labelled rows; "
        "matrix: a full k x k map, for questions of many choices with a few hundred rows or more).",
    )
    folds: int = Field(default=5, ge=2, description="Folds of the cross-validated report.")
    target: str = Field(
        default="accuracy", pattern=cal.TARGET_PATTERN,
        description="Binary questions' decision: accuracy (the most probable calibrated choice), or the threshold "
        "that maximises f1, the lowest with precision >= P, or the highest with recall >= R.",
        json_schema_extra=plain("TARGET", "accuracy, f1, precision=P or recall=R (P, R between 0 and 1)"),
    )
    content_free: list[str] = Field(default=list(cal.CONTENT_FREE), description="Content-free inputs of the contextual method.")
    no_signal: Literal["prior", "keep"] = Field(
        default="prior",
        description="A question whose cross-validated calibrated AUC has a 95% bootstrap interval holding 0.5: "
        "prior ships the class prior's map (every message gets the class frequencies), keep ships the fitted map.",
    )

    @field_validator("target")
    @classmethod
    def _target_ok(cls, v: str) -> str:
        cal.parse_target(v)
        return v

    def cli_cmd(self) -> None:
        import numpy as np

        from spinf_stream.cli.evaluation import (
            content_free_logprobs, none_data, question_report, report, signal_of, summary, write_json,
        )
        from spinf_stream.softmax import softmax

        pack, handle = self._preflight()
        rows = self._rows(pack)
        scored = self._score(pack, handle, rows=rows)
        questions = scored.questions
        # an extraction question's none decision is fitted like a yes/no question (decided by accuracy)
        nones = {qid: d for qid, e in scored.extractions.items() if (d := none_data(e)) is not None} \
            if self.method != "contextual" else {}
        if not questions and not nones and self.method != "contextual":
            raise cal.CalibrationError(f"{self.input}: labels no choice question and no extraction question with rows "
                                       f"both with and without a value; calibrate fits maps of choices and of none "
                                       f"decisions (evaluate measures extraction questions)")
        cf: dict[str, np.ndarray] = {}
        if self.method == "contextual":
            cf = content_free_logprobs(handle, pack, self.content_free, self.token_budget)
        maps: dict[str, cal.QuestionCalibration] = {}
        cv: dict[str, cal.CrossValidated | None] = {}
        for qid, d in questions.items():
            try:
                maps[qid] = cal.fit_map(self.method, d.logprobs, d.y, d.question.choices, self.target, cf.get(qid))
                cv[qid] = cal.cross_validate(self.method, d.logprobs, d.y, d.question.choices, self.target, self.folds, cf.get(qid))
            except ValueError as e:  # e.g. matrix on rows that never label a choice
                raise cal.CalibrationError(f"{self.input}: question {qid!r}: {e}") from None
        for qid, d in nones.items():
            try:
                maps[qid] = cal.fit_map(self.method, d.logprobs, d.y, cal.NONE_CHOICES, "accuracy")
                cv[qid] = cal.cross_validate(self.method, d.logprobs, d.y, cal.NONE_CHOICES, "accuracy", self.folds)
            except ValueError as e:
                raise cal.CalibrationError(f"{self.input}: question {qid!r} (its none decision): {e}") from None
        # a question (or none decision) whose fitted map ranks the rows no better than chance beyond
        # noise gets the class prior's map, so it never claims more than it knows
        signals: dict[str, dict[str, Any]] = {}
        for qid, d in (questions | nones).items():
            v = cv[qid]
            if v is None or self.method == "contextual":
                continue
            signals[qid] = signal_of(d.y, v.probabilities, prior_map=False)
            if signals[qid]["present"] is False and self.no_signal == "prior":
                choices = d.question.choices if qid in questions else cal.NONE_CHOICES
                maps[qid] = cal.fit_map(self.method, d.logprobs, d.y, choices, self.target, prior=True)
                cv[qid] = cal.cross_validate(self.method, d.logprobs, d.y, choices, self.target, self.folds, prior=True)
                signals[qid]["prior_map"] = True
                lo, hi = signals[qid]["auc_ci95"]
                print(f"{qid}: no signal for {handle.name} (cross-validated AUC {signals[qid]['auc']:.3f}, "
                      f"95% interval [{lo:.3f}, {hi:.3f}] holds 0.5): shipping the class prior's map", file=sys.stderr)
        for q in pack.expand():  # contextual needs no labels: every question gets its map
            if q.id in cf and q.id not in maps:
                scale, bias = cal.contextual_question(cf[q.id])
                maps[q.id] = cal.question_map(scale, bias, q.choices, None)
        with open(self.input, "rb") as f:
            input_sha = hashlib.file_digest(f, "sha256").hexdigest()
        fitted_on = cal.FittedOn(input_sha256=input_sha, rows={qid: int(len(d.y)) for qid, d in (questions | nones).items()},
                                 row_keys=tuple(sorted({cal.row_key(pack, r.message.fields) for r in rows})))
        result = cal.build(pack, handle.identity, self.method, self.target, maps,
                           self.content_free if self.method == "contextual" else None, fitted_on)
        out = Path(self.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(result.to_json())
        entries: dict[str, Any] = {}
        for qid, d in questions.items():
            v = cv[qid]
            if v is None:
                print(f"{qid}: too few rows of some choice for {self.folds}-fold cross-validation; calibrated: null",
                      file=sys.stderr)
            entries[qid] = question_report(d, (v.probabilities, v.answers) if v else None, signals.get(qid))
            if self.plots:
                from spinf_stream.plots import question_plots

                question_plots(self.plots, qid, d.question.choices, d.y, softmax(d.logprobs),
                               v.probabilities if v else None, f"{self.method}, {v.folds if v else 0}-fold CV")
        none_decisions = {}
        for qid, d in nones.items():
            v = cv[qid]
            none_decisions[qid] = question_report(d, (v.probabilities, v.answers) if v else None, signals.get(qid))
        doc = report(pack, handle.name, result.id, entries, scored.extractions, none_decisions)
        if self.report:
            write_json(self.report, doc)
        print(summary(doc), file=sys.stderr)
        used = sorted({v.folds for v in cv.values() if v is not None})  # choice questions and none decisions
        how = " or ".join(f"{n}-fold" for n in used) + " cross-validated" if used else "absent (too few rows)"
        if used and used != [self.folds]:
            how += f" (--folds {self.folds}, fewer where a choice has fewer rows)"
        print(f"wrote {out} ({result.id}); calibrated columns are {how}", file=sys.stderr)


class LabelsCommand(BaseSettings):
    """Write a pack's labelled rows (the input of evaluate and calibrate) from the data sets its
    mapping (packs/<pack>/data.yaml) names."""

    model_config = settings_config()

    pack: str = pack_field()
    data: str | None = Field(
        default=None, description="Folder of the data sets (default: $SPINF_DATA_DIR, else ../shared/data beside the repository).",
        json_schema_extra=plain("DIR"),
    )
    output: str | None = Field(default=None, description="Write the rows here (default: .cache/labelled/<pack>.jsonl).",
                               json_schema_extra=plain("FILE"))
    rows: int | None = Field(default=None, ge=1, description="Rows per data set (default: each set's own).")
    held_out: bool = Field(default=False, description="Write the rows the sets hold out (their `held_out`: never "
                           "calibrated on) instead, to .cache/labelled/<pack>.held_out.jsonl by default.")

    def cli_cmd(self) -> None:
        import orjson

        from . import preflight
        from spinf_stream.label_sets import data_dir, labelled_rows

        pack = preflight.check_pack(self.pack)
        assert pack.source is not None
        name = f"{pack.name}.held_out.jsonl" if self.held_out else f"{pack.name}.jsonl"
        out = Path(self.output) if self.output else Path(".cache") / "labelled" / name
        preflight.check_output_file(out, "--output", "SPINF_OUTPUT")
        rows = labelled_rows(Path(pack.source), data_dir(self.data), self.rows, held_out=self.held_out)
        if self.held_out and not rows:
            raise UsageError(f"pack {pack.name} holds out no rows: give a set of {Path(pack.source).with_suffix('')}"
                             f"/data.yaml a held_out count")
        out.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        kind = "held-out" if self.held_out else "labelled"
        print(f"{out}: {len(rows)} {kind} rows of pack {pack.name}", file=sys.stderr)
