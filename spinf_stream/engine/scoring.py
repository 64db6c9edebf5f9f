"""The :class:`Engine`: load, prepare, run, records out.

Read each message once, answer every question of a pack as a short
branch of one packed forward pass, and read choice log-probabilities from the logits.

It knows nothing of Kafka: ``prepare`` (tokenize, cheap) and ``run`` (forward passes, blocking)
are all the stream calls.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from spinf_stream.engine.layout import preamble_pass
from spinf_stream.messages import Message, has_visible_content
from spinf_stream.images import ImageLimits, ImageRejected, field_pictures, is_picture_value
from spinf_stream.engine.segment import LayoutError, PreparedMessage, Segmenter
from spinf_stream.engine.tokenizer import SpecialTokensInFields
from spinf_stream.engine.views import pick
from spinf_stream.models import QUANTIZED, Decoder, load_decoder
from spinf_stream.models.decoder import LayerKV
from spinf_stream.engine.decoding import ExtractionResult, Grammars
from spinf_stream.engine.runner import RunStats, run_passes
from spinf_stream.packs import Pack, load_pack
from spinf_stream.engine import DEFAULT_TOKEN_BUDGET
from spinf_stream.models import numerics
from spinf_stream.engine.results import ErrorInfo, ErrorRecord, ModelRef, NumericsRef, PackRef, ScoreRecord, digest
from spinf_stream.softmax import softmax_row

if TYPE_CHECKING:
    from spinf_stream.calibration import Calibration

log = logging.getLogger(__name__)

#: dtype names written in records (``fp8`` and ``int8`` are named by ``Engine.load``'s caller)
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def load_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    """The dtype :func:`~spinf_stream.models.load_decoder` takes: a torch dtype for its name
    (``float32``, ``bfloat16``, ``float16``), ``fp8``/``int8`` as they are.

    Raises:
        ValueError: an unknown name.
    """
    if isinstance(dtype, str) and dtype not in QUANTIZED:
        by_name = {name: dt for dt, name in DTYPE_NAMES.items()}
        if dtype not in by_name:
            raise ValueError(f"dtype {dtype!r} is not known; use one of {', '.join([*by_name, *QUANTIZED])}")
        return by_name[dtype]
    return dtype


def _error(msg_id: str | None, kind: str, message: str) -> ErrorRecord:
    return ErrorRecord(id=msg_id, error=ErrorInfo(kind=kind, message=message))


def choice_scores(logprobs: Sequence[float]) -> list[tuple[float, float, float]]:
    """``(probability, logprob, floor)`` per choice from the choices' logprobs (float64).

    ``probability`` = softmax over the choices (:func:`spinf_stream.softmax.softmax_row`),
    ``floor`` = ``exp(logprob)``.
    """
    return [(p, lp, math.exp(lp)) for p, lp in zip(softmax_row(logprobs), logprobs)]


def prepare_with(
    segmenter: Segmenter, messages: Sequence[Message], limits: ImageLimits = ImageLimits(),
) -> list[PreparedMessage | ErrorRecord]:
    """:meth:`Engine.prepare` with ``segmenter`` (its pack's fields checked, then tokenized): one
    :class:`PreparedMessage` or :class:`ErrorRecord` per message, in order. Needs no weights.

    A field holding pictures (an image, a video or its frames:
    :func:`spinf_stream.images.is_picture_value`) is decoded under ``limits``; one that cannot be
    read is an ``invalid_image`` or ``image_too_large`` record."""
    out: list[PreparedMessage | ErrorRecord] = []
    for i, m in enumerate(messages):
        fields: dict[str, str] = {}
        pictures: dict[str, Any] = {}
        bad: ErrorRecord | None = None
        for name in segmenter.pack.fields:
            if name in m.fields and is_picture_value(m.fields[name]):
                if segmenter.images is None:  # refused before any byte of it is decoded
                    bad = _error(m.id, "unsupported_image", f"field {name!r} holds an image; this model reads text only")
                    break
                try:
                    left = limits.max_message_pixels - sum(p.width * p.height for ps in pictures.values() for p in ps)
                    pictures[name] = field_pictures(m.fields[name], name, limits, left)
                    if sum(len(p) for p in pictures.values()) > limits.max_images:
                        raise ImageRejected("image_too_large", name, f"a message holds at most {limits.max_images} images")
                    continue
                except ImageRejected as e:
                    bad = _error(m.id, e.kind, str(e))
                    break
            if name not in m.fields or m.fields[name] is None:
                bad = _error(m.id, "missing_field", f"field {name!r} is missing")
            elif not isinstance(m.fields[name], str):
                bad = _error(
                    m.id, "wrong_type", f"field {name!r} must be a string, got {type(m.fields[name]).__name__}"
                )
            elif not has_visible_content(m.fields[name]):
                bad = _error(m.id, "empty_field", f"field {name!r} is empty (no visible character)")
            if bad:
                break
            fields[name] = m.fields[name]
        if bad:
            out.append(bad)
            continue
        try:
            out.append(segmenter.prepare(i, m.id, fields, pictures))
        except LayoutError as e:
            out.append(_error(m.id, e.kind, str(e)))
    return out


class Engine:
    """Scores messages against one pack with one model.

    Args:
        decoder: the model. tokenizer: its transformers fast tokenizer.
        pack: the validated pack. model_name: the name written in records.
        token_budget: tokens per forward pass (default 16,384).
        model_sha256: the weights' sha256 written in records (``ResolvedModel.weights_sha256``).
        dtype_name: the dtype written in records; default: the decoder's (``fp8``, ``int8`` must be named).
        special_tokens_in_fields: ``"plain"`` (special-token text in message fields is plain
            text) or ``"parse"`` (the tokenizer's default: control tokens); ``None`` = the pack's
            ``special_tokens_in_fields`` (see :mod:`spinf_stream.engine.tokenizer`).
        calibration: per-question maps applied to every record (already checked against this
            pack file and model, see ``spinf_stream.calibration.resolve``), or ``None``.
        allow_unstable_bits: score even when the bits probe fails on this machine (records then
            say ``"bits_probe": "failed"``); default: refuse.

    Raises:
        spinf_stream.models.numerics.UnstableBits: the bits probe failed (the message names the
            shape and the BLAS) and ``allow_unstable_bits`` is not set.
        spinf_stream.engine.segment.LayoutError: a choice whose tokens merge with its question's.
        spinf_stream.calibration.CalibrationError: a calibration of other questions or choices.
        ValueError: a bad ``token_budget`` or ``special_tokens_in_fields``.
    """

    def __init__(
        self, decoder: Decoder, tokenizer: Any, pack: Pack, model_name: str,
        token_budget: int = DEFAULT_TOKEN_BUDGET, special_tokens_in_fields: SpecialTokensInFields | None = None,
        *, model_sha256: str | None = None, dtype_name: str | None = None, calibration: Calibration | None = None,
        allow_unstable_bits: bool = False,
    ) -> None:
        if token_budget < 1:
            raise ValueError("token_budget must be a positive number of tokens")
        # before anything runs: the machine must compute a row's bits the way the engine relies on
        described = numerics.describe(decoder.device, decoder.backend.name, decoder.dtype)
        probe = numerics.check_bits(decoder, allow_unstable_bits)
        self.numerics = NumericsRef(
            isa=described.isa, library=described.library, tiles=described.tiles,
            bits_probe=probe or described.bits_probe,
        )
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.pack = pack
        self.model_name = model_name
        self.model_sha256 = model_sha256
        self.device = decoder.device.type
        self.dtype = dtype_name or DTYPE_NAMES[decoder.dtype]
        # The Triton kernels run on CUDA, and on CPU tensors (interpreted) when SPINF_KERNELS=triton.
        self.kernels = decoder.backend.name
        self.token_budget = token_budget
        self.segmenter = Segmenter(tokenizer, pack, decoder.spec.max_positions, special_tokens_in_fields,
                                   images=decoder.vision.format if decoder.vision else None)
        self.questions = self.segmenter.questions
        self.preamble_len = len(self.segmenter.preamble_ids)
        # Maps fixed once per pack and model: applying them is a few flops per choice.
        self.calibration = calibration
        self._maps = calibration.bind(self.questions) if calibration else [None] * len(self.questions)
        self._rules = [_decision(m, calibration) for m in self._maps]
        self.prefix: LayerKV | None = self._prefill_preamble()
        self.grammars = _grammars(self.questions, tokenizer)
        if self.grammars is not None:
            self.grammars.none_rules.update(
                (qi, _none_rule(m)) for qi, (q, m) in enumerate(zip(self.questions, self._maps))
                if m is not None and q.extract is not None)
        self.last_run = RunStats()  # of the latest run(); read by the stream's telemetry

    @classmethod
    def load(
        cls, model: str, pack: str | Path | Pack, *, token_budget: int = DEFAULT_TOKEN_BUDGET,
        dtype: torch.dtype | str = torch.float32, device: str = "cpu", kernels: str | None = None,
        special_tokens_in_fields: SpecialTokensInFields | None = None,
        calibration: str | Path | Calibration | None = "auto", allow_unstable_bits: bool = False,
        threads: int | None = None,
    ) -> Engine:
        """Resolve ``model`` (alias, HF directory or GGUF file) and ``pack`` (path or name), load.

        ``dtype``: a torch dtype or its name (``float32``, ``bfloat16``, ``float16``), ``fp8`` or
        ``int8`` (linear weights in float8 e4m3 or int8, the rest bfloat16; see
        :func:`spinf_stream.models.build_decoder`); ``device``: a torch device (``cpu``, ``cuda``,
        ``cuda:N``) — check both first with :func:`spinf_stream.device.choose`; ``kernels``: the
        back end (default: Triton on CUDA, torch on CPU unless ``SPINF_KERNELS=triton``).
        ``special_tokens_in_fields`` overrides the pack's (``None``: keep it); see :class:`Engine`.
        ``calibration``: ``"auto"`` (the pack's shipped calibration for this model, if any),
        ``"none"``/``None``, a calibration file, or a :class:`~spinf_stream.calibration.Calibration`.
        ``allow_unstable_bits``: see :class:`Engine`. ``threads``: the CPU engine's compute
        workers (default :func:`spinf_stream.cpus.compute_threads`; scores do not depend on it).

        Raises:
            spinf_stream.models.resolve.ModelNotInstalled, ModelLoadError, PackError,
            spinf_stream.calibration.CalibrationError, spinf_stream.models.numerics.UnstableBits;
            ValueError: a kernel back end that cannot run on ``device``.
        """
        from transformers import AutoTokenizer

        from spinf_stream import calibration as cal
        from spinf_stream.models.resolve import resolve

        dtype = load_dtype(dtype)
        pk = pack if isinstance(pack, Pack) else load_pack(pack)
        resolved = resolve(model)
        chosen = cal.resolve(calibration, pk, resolved)  # before the weights: a wrong file fails fast
        decoder = load_decoder(resolved.path, dtype=dtype, device=device, kernels=kernels, threads=threads)
        tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))
        return cls(
            decoder, tokenizer, pk, resolved.name, token_budget, special_tokens_in_fields,
            model_sha256=resolved.weights_sha256, dtype_name=dtype if dtype in QUANTIZED else None,
            calibration=chosen, allow_unstable_bits=allow_unstable_bits,
        )

    @property
    def model_info(self) -> ModelRef:
        """The ``model`` block of every record: name, weights' sha256, device, dtype, kernels, numerics."""
        return ModelRef(
            name=self.model_name, sha256=self.model_sha256, device=self.device, dtype=self.dtype, kernels=self.kernels,
            numerics=self.numerics,
        )

    @property
    def max_positions(self) -> int:
        """The model's context (tokens)."""
        return int(self.decoder.spec.max_positions)

    def loaded_decoder(self) -> Decoder:
        """The decoder, for reads without the pack (:mod:`spinf_stream.engine.reads`). Engine thread only."""
        return self.decoder

    def _prefill_preamble(self) -> LayerKV | None:
        ids = self.segmenter.preamble_ids
        if not ids:
            return None
        _, kept = self.decoder.forward(preamble_pass(ids))
        return kept[0]

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self, messages: Sequence[Message]) -> list[PreparedMessage | ErrorRecord]:
        """Validate and tokenize; cheap, CPU only, safe to call from another thread than ``run``.

        Returns one item per message, in order: a :class:`PreparedMessage` or an
        :class:`ErrorRecord` (``missing_field``, ``wrong_type``, ``empty_field``, ``too_long``,
        ``choice_tokenization``).
        """
        return prepare_with(self.segmenter, messages)

    def prefix_chars_bound(self, text: str) -> int:
        """Characters of a field's ``text`` beyond which no prefix of it can fit the model's
        context (``--too-long truncate`` searches below it; cheap for any length of ``text``)."""
        return self.segmenter.prefix_chars_bound(text)

    # -- run -------------------------------------------------------------------------------

    def run(self, prepared: Sequence[PreparedMessage]) -> list[ScoreRecord]:
        """Score prepared messages in packed forward passes (blocking; seconds on CPU).

        Returns one :class:`ScoreRecord` per message, in the given order.
        """
        reads = [r for p in prepared for r in (p, *p.views)]  # a message's views read as messages of their own
        sums, extracted, self.last_run = run_passes(
            self.decoder, reads, self.token_budget, self.prefix, self.preamble_len,
            [len(q.choices) for q in self.questions], self.grammars,
        )
        out = []
        at = 0
        for p in prepared:
            n = 1 + len(p.views)
            out.append(self._record(p, sums[at:at + n], extracted[at]))
            at += n
        return out

    def run_iter(self, prepared: Sequence[PreparedMessage]) -> Iterator[list[ScoreRecord]]:
        """Like :meth:`run`, but yields as it goes: the records of about one forward pass at a time
        (consecutive messages whose ``cost_tokens`` — prefill and decode steps — fit the token
        budget; a longer message alone), in input order. Scores are those of :meth:`run`: they do not depend on the passes' composition.

        Stop early by closing the iterator: no pass starts after the one in flight.
        """
        group: list[PreparedMessage] = []
        used = 0
        for p in prepared:
            if group and used + p.cost_tokens > self.token_budget:
                yield self.run(group)
                group, used = [], 0
            group.append(p)
            used += p.cost_tokens
        if group:
            yield self.run(group)

    def _record(
        self, p: PreparedMessage, reads: Sequence[dict[int, list[float]]], extracted: dict[int, ExtractionResult],
    ) -> ScoreRecord:
        """``reads``: the choice logprob sums of the message, then of each of its views."""
        scores: dict[str, Any] = {}
        sums = reads[0]
        for qi, q in enumerate(self.questions):
            if q.extract is not None:
                e = extracted[qi]
                scores[q.id] = {
                    "kind": e.kind, "answer": e.answer, "value": e.value, "probability": e.probability,
                    "logprob": e.logprob, "none_probability": e.none_probability, "tokens": e.tokens,
                    "min_token_probability": e.min_token_probability,
                } | ({"currency": e.currency} if e.currency is not None else {}) \
                  | ({"none_calibrated": e.none_calibrated} if e.none_calibrated is not None else {})
                continue
            candidates = [(m, r[qi]) for m, r in zip((p, *p.views), reads) if qi in r]
            if q.choice_scoring == "mean":  # the sum over each choice's tokens, divided by their number
                candidates = [(m, [lp / len(path) for lp, path in zip(lps, _branch(m, qi).choices)]) for m, lps in candidates]
            chosen, lps = candidates[pick([c for _, c in candidates])]
            cs = choice_scores(lps)
            choices = {label: {"probability": pr, "logprob": lp, "floor": fl} for label, (pr, lp, fl) in zip(q.choices, cs)}
            qmap = self._maps[qi]
            if qmap is None:
                best = max(range(len(cs)), key=lambda j: cs[j][0])
            else:
                calibrated = qmap.probabilities(lps)
                for label, c in zip(q.choices, calibrated):
                    choices[label]["calibrated"] = c
                best = qmap.answer(calibrated)
            scores[q.id] = {"answer": q.choices[best], "choices": choices} | self._rules[qi] \
                | ({"choice_scoring": q.choice_scoring} if q.choice_scoring != "sum" else {}) \
                | ({"view": chosen.view or "whole"} if len(candidates) > 1 else {})
        return ScoreRecord(
            id=p.id,
            pack=PackRef(
                name=self.pack.name, version=self.pack.version,
                special_tokens_in_fields=self.segmenter.tokenizer.mode,
            ),
            model=self.model_info,
            scores=scores,
            calibration=self.calibration.id if self.calibration else None,
            digest=digest(scores),
        )

    def score(self, messages: Sequence[Message]) -> list[ScoreRecord | ErrorRecord]:
        """``prepare`` + ``run``, one record per message in input order."""
        items = self.prepare(messages)
        ok = [p for p in items if isinstance(p, PreparedMessage)]
        done = iter(self.run(ok))
        return [next(done) if isinstance(p, PreparedMessage) else p for p in items]


def _branch(m: PreparedMessage, question: int) -> Any:
    """The branch of ``question`` in message ``m``."""
    (branch,) = (b for b in m.branches if b.question == question)
    return branch


def _decision(qmap: Any, calibration: Calibration | None) -> dict[str, Any]:
    """A question's ``threshold`` and ``rule`` in its records when a threshold decides it, else ``{}``."""
    from spinf_stream.calibration import decision_rule

    if qmap is None or calibration is None or qmap.threshold is None:
        return {}
    return {"threshold": qmap.threshold, "rule": decision_rule(qmap, calibration)}


def _none_rule(qmap: Any) -> Any:
    """An extraction question's none decision from its calibration's none map: raw
    ``none_probability`` -> (calibrated probability of none, answer none?)."""
    from spinf_stream.calibration import none_features

    def rule(p: float) -> tuple[float, bool]:
        calibrated = qmap.probabilities(none_features(p))
        return calibrated[0], qmap.answer(calibrated) == 0

    return rule


def _grammars(questions: Sequence[Any], tokenizer: Any) -> Grammars | None:
    """Each extraction question's token grammar over the tokenizer's vocabulary (built once per
    engine), or ``None`` for a pack of choice questions only."""
    specs = {i: q.extract for i, q in enumerate(questions) if q.extract is not None}
    if not specs:
        return None
    from spinf_stream.engine.grammar import GrammarSpec, TokenGrammar, token_bytes

    vocab = token_bytes(tokenizer)
    eos = {i for i in (tokenizer.eos_token_id,) if i is not None}
    built: dict[Any, TokenGrammar] = {}
    grammars = {}
    for i, x in specs.items():
        spec = GrammarSpec("text" if x.kind == "generate" else x.kind, x.none, x.stop, x.currency_default)
        if spec not in built:
            built[spec] = TokenGrammar.build(spec, vocab, eos)
        grammars[i] = built[spec]
    return Grammars(specs, grammars, vocab)
