"""The work of ``evaluate`` and ``calibrate``: score labelled rows, fit, report.

The pack author's loop on labelled rows (``spinf_stream.labelled``): measure a pack, fit its
calibration, measure it again.

Rows are scored with the whole pack, so every number is the one ``score`` gives (a message's
longest branch sets its attention shapes, so a sub-pack can change the last bits). ``--cache
DIR`` keeps every (row, question)'s raw logprobs (an extraction's record), keyed by the model's
weights and everything that defines the prompt, so refitting and replotting never rescore.

Report (``--report``), exactly::

    {"pack": {"name", "version", "sha256" (of its file)}, "model": "<name>", "calibration": "<id>" | null,
     "questions": {"<id>": {"n": rows,
                            "raw": {metric: value}, "calibrated": {metric: value} | null,
                            "baseline": {"accuracy": ..., "log_loss": ...},
                            "signal": {"auc", "auc_ci95", "present", "prior_map"}}},   # calibrate only
     "extractions": {"<id>": {"kind": ..., **extraction metrics}}}

with the metrics of :func:`spinf_stream.quality.question_metrics` and ``auc_ci95`` (the AUC's 95 %
bootstrap interval) and, for labelled extraction questions (the key is left out when there are
none), of :func:`spinf_stream.quality.extraction_metrics` (exact match, none accuracy, ECE of
``probability``); calibrations are fitted for choice questions and none decisions only.
``evaluate`` applies a fixed calibration to every row; ``calibrate`` reports k-fold
cross-validated numbers (each row's calibrated probabilities come from a map fitted on the other
folds), never fit-on-test ones, and ``signal`` (:func:`signal_of`): a question whose fitted map
ranks its rows no better than chance is shipped the class prior's map.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from spinf_stream import calibration as cal
from spinf_stream.engine import DEFAULT_TOKEN_BUDGET
from spinf_stream.engine.results import ExtractionScore
from spinf_stream.labelled import Expected, LabelledRow, LabelledSet, read_labelled
from spinf_stream.messages import Message
from spinf_stream.quality import auc, auc_interval, baseline, clean, extraction_metrics, has_signal, question_metrics
from spinf_stream.softmax import softmax
from spinf_stream.packs import ExpandedQuestion, Pack
from spinf_stream.engine.segment import PreparedMessage

if TYPE_CHECKING:
    from spinf_stream.engine.scoring import Engine

log = logging.getLogger(__name__)

#: rows handed to the engine at a time (paces the progress bar and the cache's appends)
CHUNK_ROWS = 64


# --------------------------------------------------------------------------------- sub-packs


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def sub_pack(pack: Pack, question_ids: Sequence[str]) -> Pack:
    """``pack`` with only the (expanded) questions ``question_ids``, in pack order.

    Its prompts are exactly the full pack's for those questions (same preamble, prompt, question
    template, answer prefix, question texts and choices); its numbers may differ from the whole
    pack's in the last bits (a message's longest branch sets its attention shapes), so
    ``evaluate``/``calibrate`` score with the whole pack. Raises ``KeyError`` naming an unknown
    question id. ``views`` keeps the questions it names that are kept (none kept: no views).
    """
    by_id = {q.id: q for q in pack.expand()}
    for qid in question_ids:
        if qid not in by_id:
            raise KeyError(f"no question {qid!r} in pack {pack.name!r}")
    wanted = set(question_ids)
    data = pack.model_dump(mode="json")
    data["questions"] = [
        {"id": _escape(q.id), "text": _escape(q.text), "choices": list(q.choices)}
        | ({"question": q.template} if q.template is not None else {})
        for q in pack.expand() if q.id in wanted
    ]
    if pack.views is not None:
        kept = [qid for qid in pack.views.questions if qid in wanted]
        data["views"] = {**data["views"], "questions": kept} if kept else None
    return Pack.model_validate(data)


# ------------------------------------------------------------------------------ logprob cache


class LogprobCache:
    """Raw choice logprobs (an extraction question: its record) per (row, question) for one model,
    optionally kept in ``directory``.

    One append-only JSON Lines file per model (``<name>-<weights sha256[:16]>-<dtype>-<device>.jsonl``),
    each line ``{"k": key, "lp": [logprob per choice]}``; the key hashes everything that defines
    the prompt (preamble, prompt template, question template and text, answer prefix, choices,
    the message's fields, and how fields are read and choices scored: ``normalize_fields``,
    ``escape_in_fields``, ``special_tokens_in_fields``, ``choice_scoring``, ``views``) and the pack's other questions (a message's branches share its
    attention shapes: its longest branch sets the own-branch window of all of them, so a question
    has its numbers in the context of its pack), so an edited pack or message is simply scored
    again.
    """

    def __init__(self, directory: str | Path | None, model_key: str) -> None:
        self.entries: dict[str, list[float]] = {}
        self.path: Path | None = None
        if directory is not None:
            self.path = Path(directory) / f"{model_key}.jsonl"
            if self.path.is_file():
                for line in self.path.read_bytes().splitlines():
                    try:
                        e = orjson.loads(line)
                        self.entries[e["k"]] = e["lp"]
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        continue  # a line cut by a killed run: score that row again

    @staticmethod
    def key(pack: Pack, question: ExpandedQuestion, fields: dict[str, Any], none_map: Any = None) -> str:
        siblings = [[pack.render_question(q), list(q.choices), q.extract.max_tokens if q.extract else 0]
                    for q in pack.expand()]
        parts = [pack.preamble, pack.prompt, pack.render_question(question), pack.answer_prefix, list(question.choices),
                 [fields.get(f) for f in pack.fields], siblings]
        reading = {  # how fields are read and choices scored, where not the default (older keys hold)
            "normalize_fields": pack.normalize_fields if pack.normalize_fields != "none" else None,
            "escape_in_fields": pack.escape_in_fields or None,
            "special_tokens_in_fields": pack.special_tokens_in_fields if pack.special_tokens_in_fields != "plain" else None,
            "choice_scoring": question.choice_scoring if question.choice_scoring != "sum" else None,
            "views": pack.views.model_dump(mode="json") if pack.views is not None else None,
        }
        if any(v is not None for v in reading.values()):
            parts.append({k: v for k, v in reading.items() if v is not None})
        if question.extract is not None:  # what the model may write, and how it is read
            parts.append(dataclasses.asdict(question.extract))
        if none_map is not None:  # a calibration's none decision changes what is written
            parts.append(none_map.model_dump(mode="json"))
        return hashlib.sha256(orjson.dumps(parts)).hexdigest()[:32]

    def get(self, key: str) -> Any:
        """A choice question's logprobs (list), an extraction's record (dict), or None."""
        return self.entries.get(key)

    def put(self, items: Sequence[tuple[str, Any]]) -> None:
        for k, lp in items:
            self.entries[k] = lp
        if self.path is not None and items:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as f:
                f.write(b"".join(orjson.dumps({"k": k, "lp": lp}) + b"\n" for k, lp in items))


# ------------------------------------------------------------------------------------- scoring


class ModelHandle:
    """A model reference, resolved at once and loaded only when something must be scored.

    ``dtype``/``device``: as chosen by :func:`spinf_stream.device.choose` (``float32``,
    ``bfloat16``, ``float16``, ``fp8`` or ``int8``; ``cpu``, ``cuda``, ``cuda:N``). The raw logprobs are
    cached per model weights, dtype and device (``cache_key``).
    """

    def __init__(
        self, model: str, dtype: str = "float32", device: str = "cpu", kernels: str | None = None,
        *, allow_unstable_bits: bool = False,
    ) -> None:
        from spinf_stream.models.resolve import resolve

        self.ref, self.dtype, self.device, self.kernels = model, dtype, device, kernels
        self.allow_unstable_bits = allow_unstable_bits
        self.resolved = resolve(model)
        self._identity: cal.ModelIdentity | None = None
        self._loaded: tuple[Any, Any] | None = None

    @property
    def name(self) -> str:
        return self.resolved.name

    @property
    def identity(self) -> cal.ModelIdentity:
        if self._identity is None:
            self._identity = cal.model_identity(self.resolved)
        return self._identity

    def cache_key(self) -> str:
        """Weights, dtype, device and what else decides the bits (the ``numerics`` of the records,
        as a short hash): logprobs cached on another kind of machine are not reused here."""
        import hashlib

        import torch

        from spinf_stream.models import QUANTIZED, numerics
        from spinf_stream.models.backend import choose

        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(self.name).name)
        dev = torch.device(self.device)
        act = torch.bfloat16 if self.dtype in QUANTIZED else getattr(torch, self.dtype)
        n = numerics.describe(dev, choose(dev, self.kernels, self.dtype), act)
        tag = hashlib.sha256(f"{n.isa}|{n.library}|{n.tiles}".encode()).hexdigest()[:8]
        return f"{safe}-{self.identity.weights_sha256[:16]}-{self.dtype}-{dev.type}-{tag}"

    def engine(self, pack: Pack, token_budget: int, calibration: cal.Calibration | None = None) -> Engine:
        """An engine for ``pack``, sharing the loaded weights: raw numbers, or with ``calibration``
        (whose none maps decide extractions' none answers; choice logprobs stay raw)."""
        from spinf_stream.engine.scoring import DTYPE_NAMES, Engine
        from spinf_stream.models import QUANTIZED

        if self._loaded is None:
            from transformers import AutoTokenizer

            from spinf_stream.models import load_decoder

            by_name = {name: dt for dt, name in DTYPE_NAMES.items()}
            dtype = self.dtype if self.dtype in QUANTIZED else by_name[self.dtype]
            decoder = load_decoder(self.resolved.path, dtype=dtype, device=self.device, kernels=self.kernels)
            self._loaded = (decoder, AutoTokenizer.from_pretrained(str(self.resolved.path)))
        decoder, tokenizer = self._loaded
        return Engine(
            decoder, tokenizer, pack, self.name, token_budget,
            model_sha256=self.resolved.weights_sha256, dtype_name=self.dtype if self.dtype in QUANTIZED else None,
            allow_unstable_bits=self.allow_unstable_bits, calibration=calibration,
        )


@dataclass(frozen=True)
class QuestionData:
    """One labelled question's rows: raw choice logprobs float64 ``[n, k]``, the right choice's
    index int ``[n]``, and the rows' ids."""

    question: ExpandedQuestion
    logprobs: np.ndarray
    y: np.ndarray
    ids: tuple[str, ...]


@dataclass(frozen=True)
class ExtractionData:
    """One labelled extraction question's rows: the right answers, the records' ``scores[qid]``
    as JSON, and the rows' ids."""

    question: ExpandedQuestion
    expected: tuple[Expected, ...]
    scores: tuple[dict[str, Any], ...]
    ids: tuple[str, ...]


@dataclass(frozen=True)
class Scored:
    """What :func:`score_labelled` returns: per labelled question its rows (pack order), and the
    rows the engine refused (line → ``"kind: message"``), which are left out."""

    questions: dict[str, QuestionData]
    extractions: dict[str, ExtractionData]
    failed: dict[int, str]


def score_labelled(handle: ModelHandle, pack: Pack, rows: Sequence[LabelledRow], cache: LogprobCache, *,
                   token_budget: int = DEFAULT_TOKEN_BUDGET, progress: bool = True,
                   calibration: cal.Calibration | None = None, labelled_only: bool = False) -> Scored:
    """Raw logprobs of every labelled (row, choice question) and the record of every labelled
    (row, extraction question), from the cache or the engine.

    Rows that still need a question are scored with the whole pack, so each number is the one
    ``score`` gives (a sub-pack of fewer questions can give a message other attention shapes,
    hence other bits: measured on AMD EPYC, 34 of 60 messages 1e-6 apart). ``labelled_only``
    scores with the sub-pack of the questions the rows label instead (cached apart): a pack of
    many questions reads many times faster, its numbers off in the last bits. With
    ``calibration``, its none maps decide the extractions' none answers (choice logprobs are raw
    either way).
    """
    from tqdm import tqdm

    if labelled_only:
        wanted = {qid for r in rows for qid in r.questions}
        pack = sub_pack(pack, [q.id for q in pack.expand() if q.id in wanted])
        if calibration is not None:
            calibration = calibration.model_copy(
                update={"questions": {q: m for q, m in calibration.questions.items() if q in wanted}})
    questions = {q.id: q for q in pack.expand()}
    order = {qid: i for i, qid in enumerate(questions)}
    none_maps = {q: m for q, m in calibration.questions.items() if questions[q].extract is not None} if calibration else {}
    keys = {(r.line, qid): cache.key(pack, questions[qid], dict(r.message.fields), none_maps.get(qid))
            for r in rows for qid in r.questions}
    groups: dict[tuple[str, ...], list[LabelledRow]] = {}
    for r in rows:
        missing = tuple(sorted((q for q in r.questions if cache.get(keys[r.line, q]) is None), key=order.__getitem__))
        if missing:
            groups.setdefault(missing, []).append(r)
    engine = handle.engine(pack, token_budget, calibration if none_maps else None) if groups else None
    failed: dict[int, str] = {}
    total = sum(len(g) for g in groups.values())
    if total:
        log.info("scoring %d of %d rows with %s (%d cached)", total, len(rows), handle.name, len(rows) - total)
    with tqdm(total=total, unit="row", disable=not progress or total == 0 or not sys.stderr.isatty(), file=sys.stderr) as bar:
        for qids, group in groups.items():
            assert engine is not None
            for start in range(0, len(group), CHUNK_ROWS):
                chunk = group[start:start + CHUNK_ROWS]
                items = engine.prepare([r.message for r in chunk])
                ok = [(r, it) for r, it in zip(chunk, items) if isinstance(it, PreparedMessage)]
                for r, it in zip(chunk, items):
                    if not isinstance(it, PreparedMessage):
                        failed[r.line] = f"{it.error.kind}: {it.error.message}"
                records = engine.run([it for _, it in ok])
                entries = []
                for (r, _), rec in zip(ok, records):
                    for qid in qids:
                        score = rec.scores[qid]
                        if isinstance(score, ExtractionScore):
                            entries.append((keys[r.line, qid], score.model_dump(mode="json")))
                        else:
                            entries.append((keys[r.line, qid], [score.choices[c].logprob for c in questions[qid].choices]))
                cache.put(entries)
                bar.update(len(chunk))
    out: dict[str, QuestionData] = {}
    extractions: dict[str, ExtractionData] = {}
    for qid, q in questions.items():
        labelled = [r for r in rows if qid in r.questions and r.line not in failed]
        if not labelled:
            continue
        ids = tuple(r.message.id for r in labelled)
        if q.extract is not None:
            extractions[qid] = ExtractionData(q, tuple(r.expected[qid] for r in labelled),
                                              tuple(cache.get(keys[r.line, qid]) for r in labelled), ids)
        else:
            out[qid] = QuestionData(
                q,
                np.array([cache.get(keys[r.line, qid]) for r in labelled], dtype=np.float64),
                np.array([r.labels[qid] for r in labelled], dtype=int),
                ids,
            )
    return Scored(out, extractions, failed)


def content_free_logprobs(handle: ModelHandle, pack: Pack, inputs: Sequence[str], token_budget: int) -> dict[str, np.ndarray]:
    """Every question's choice logprobs ``[len(inputs), k]`` for the content-free messages (each of
    the pack's fields set to one of ``inputs``), scored once with the whole pack."""
    engine = handle.engine(pack, token_budget)
    msgs = [Message(id=f"content-free-{i}", fields={f: s for f in pack.fields}) for i, s in enumerate(inputs)]
    records = engine.score(msgs)
    choice_questions = [q for q in engine.questions if q.extract is None]  # extractions have no choices to map
    out: dict[str, list[list[float]]] = {q.id: [] for q in choice_questions}
    for rec in records:
        if not hasattr(rec, "scores"):
            raise ValueError(f"content-free input could not be scored: {rec.error.kind}: {rec.error.message}")
        for q in choice_questions:
            out[q.id].append([rec.scores[q.id].choices[c].logprob for c in q.choices])
    return {qid: np.array(v, dtype=np.float64) for qid, v in out.items()}


# --------------------------------------------------------------------------------------- report


def _metrics(y: np.ndarray, probabilities: np.ndarray, answers: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {k: clean(v) for k, v in question_metrics(y, probabilities, answers).items()}
    out["auc_ci95"] = _interval(auc_interval(y, probabilities))
    return out


def _interval(interval: tuple[float, float] | None) -> list[float] | None:
    return list(interval) if interval is not None else None


def question_report(data: QuestionData, calibrated: tuple[np.ndarray, np.ndarray] | None,
                    signal: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"n", "raw", "calibrated", "baseline"}`` of one question, plus ``signal`` when given
    (``calibrate``: see :func:`signal_of`); ``calibrated`` is ``(probabilities, answers)`` or
    ``None``. Each metrics object also holds ``auc_ci95``, :func:`~spinf_stream.quality.auc_interval`."""
    raw_p = softmax(data.logprobs)
    out = {
        "n": int(len(data.y)),
        "raw": _metrics(data.y, raw_p, raw_p.argmax(axis=1)),
        "calibrated": _metrics(data.y, *calibrated) if calibrated is not None else None,
        "baseline": baseline(data.y, raw_p.shape[1]),
    }
    if signal is not None:
        out["signal"] = signal
    return out


def signal_of(y: np.ndarray, probabilities: np.ndarray, prior_map: bool) -> dict[str, Any]:
    """Whether a question has signal for the model: ``{"auc", "auc_ci95", "present", "prior_map"}``
    of the fitted map's cross-validated probabilities ``[n, k]`` (a map of all the choices'
    logprobs can find what the raw ranking misses, and it is what a message would get);
    ``present`` is false when the interval holds 0.5 (:func:`~spinf_stream.quality.has_signal`),
    ``prior_map`` whether the shipped map is then the class prior's."""
    interval = auc_interval(y, probabilities)
    a = auc(y, probabilities)
    return {"auc": clean(a), "auc_ci95": _interval(interval),
            "present": has_signal(interval), "prior_map": prior_map}


def none_data(data: ExtractionData) -> QuestionData | None:
    """An extraction question's none decision as a two-choice question (choices
    :data:`~spinf_stream.calibration.NONE_CHOICES`, logprobs :func:`~spinf_stream.calibration.none_features`
    of the raw ``none_probability``, right choice ``none`` for rows without a value), or ``None``
    when the question has no none word or its rows are all of one kind."""
    x = data.question.extract
    if x is None or x.none is None or any(s["none_probability"] is None for s in data.scores):
        return None
    y = np.array([0 if e.none else 1 for e in data.expected], dtype=int)
    if len(set(y.tolist())) < 2:
        return None
    q = dataclasses.replace(data.question, choices=cal.NONE_CHOICES)
    lp = np.array([cal.none_features(s["none_probability"]) for s in data.scores], dtype=np.float64)
    return QuestionData(q, lp, y, data.ids)


def extraction_report(data: ExtractionData, none_decision: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"kind", **extraction_metrics}`` of one extraction question, with ``none_decision`` (the
    :func:`question_report` of its none map, see :func:`none_data`) when given."""
    assert data.question.extract is not None
    out = {"kind": data.question.extract.kind, **extraction_metrics(data.expected, data.scores)}
    if none_decision is not None:
        out["none_decision"] = none_decision
    return out


def report(pack: Pack, model_name: str, calibration_id: str | None, questions: dict[str, dict[str, Any]],
           extractions: dict[str, ExtractionData] | None = None,
           none_decisions: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The report document (see the module docstring)."""
    doc = {
        "pack": {"name": pack.name, "version": pack.version, "sha256": cal.pack_identity(pack).sha256},
        "model": model_name,
        "calibration": calibration_id,
        "questions": questions,
    }
    if extractions:
        doc["extractions"] = {qid: extraction_report(d, (none_decisions or {}).get(qid)) for qid, d in extractions.items()}
    return doc


def write_json(path: str | Path, doc: Any) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")


def summary(doc: dict[str, Any]) -> str:
    def f(x: float | None) -> str:
        return "  n/a" if x is None else f"{x:.3f}"

    lines = [f"{'question':<28} {'n':>5} {'auc':>6} {'acc raw→cal':>13} {'ece raw→cal':>13} {'logloss raw→cal':>16} "
             f"{'majority':>8} {'prior ll':>8}"] if doc["questions"] else []
    for qid, q in doc["questions"].items():
        c = q["calibrated"] or {}
        lines.append(
            f"{qid[:28]:<28} {q['n']:>5} {f(q['raw']['auc']):>6} {f(q['raw']['accuracy'])}→{f(c.get('accuracy'))}"
            f" {f(q['raw']['ece'])}→{f(c.get('ece'))}  {f(q['raw']['log_loss'])}→{f(c.get('log_loss'))}"
            f" {f(q['baseline']['accuracy']):>8} {f(q['baseline']['log_loss']):>8}"
            + ("  no signal: class prior" if q.get("signal", {}).get("prior_map") else "")
        )
    if doc.get("extractions"):
        lines.append(f"{'extraction':<28} {'n':>5} {'kind':>6} {'exact':>6} {'of values':>9} {'none acc':>8} "
                     f"{'ece':>6} {'none auc':>8}")
        for qid, e in doc["extractions"].items():
            lines.append(f"{qid[:28]:<28} {e['n']:>5} {e['kind']:>6} {f(e['exact_match']):>6} {f(e['value_exact_match']):>9}"
                         f" {f(e['none_accuracy']):>8} {f(e['ece']):>6} {f(e['none_auc']):>8}")
    return "\n".join(lines)


def read_rows(pack: Pack, path: str) -> LabelledSet:
    data = read_labelled(path, pack.expand())
    print(f"{path}: {len(data.rows)} labelled rows; {data.skipped_unlabelled} without labels skipped", file=sys.stderr)
    return data


def report_failed(failed: dict[int, str]) -> None:
    if failed:
        first = ", ".join(f"line {n} ({why})" for n, why in list(sorted(failed.items()))[:3])
        print(f"{len(failed)} rows could not be scored and are left out: {first}", file=sys.stderr)
