"""The decision engine: read each message once, answer every question of a pack as a short
branch of one packed forward pass, and read choice log-probabilities from the logits.

It knows nothing of Kafka: ``prepare`` (tokenize, cheap) and ``run`` (forward passes, blocking)
are all the stream calls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .layout import build_pass, plan_passes, preamble_pass
from .segment import LayoutError, PreparedMessage, Segmenter
from .models import Decoder, load_decoder
from .models.decoder import PrefixKV
from .packs import Pack, load_pack
from .records import ErrorInfo, ErrorRecord, PackRef, ScoreRecord, digest

if TYPE_CHECKING:
    from .calibration import Calibration

DEFAULT_TOKEN_BUDGET = 16_384


@dataclass(frozen=True)
class Message:
    """One input message: its ``id`` and the raw JSON values of its fields."""

    id: str
    fields: Mapping[str, Any] = field(default_factory=dict)


def _error(msg_id: str | None, kind: str, message: str) -> ErrorRecord:
    return ErrorRecord(id=msg_id, error=ErrorInfo(kind=kind, message=message))


def choice_scores(logprobs: Sequence[float]) -> list[tuple[float, float, float]]:
    """``(probability, logprob, floor)`` per choice from the choices' logprobs (float64).

    ``probability`` = softmax over the choices, ``floor`` = ``exp(logprob)``.
    """
    top = max(logprobs)
    e = [math.exp(lp - top) for lp in logprobs]
    total = math.fsum(e)
    return [(x / total, lp, math.exp(lp)) for x, lp in zip(e, logprobs)]


class Engine:
    """Scores messages against one pack with one model.

    Args:
        decoder: the model. tokenizer: its transformers fast tokenizer.
        pack: the validated pack. model_name: the name written in records.
        token_budget: tokens per forward pass (default 16,384).
        calibration: per-question maps applied to every record (already checked against this
            pack file and model, see ``spinf_stream.calibration.resolve``), or ``None``.

    Raises:
        spinf_stream.segment.LayoutError: a choice whose tokens merge with its question's.
        spinf_stream.calibration.CalibrationError: a calibration of other questions or choices.
    """

    def __init__(
        self, decoder: Decoder, tokenizer: Any, pack: Pack, model_name: str,
        token_budget: int = DEFAULT_TOKEN_BUDGET, calibration: Calibration | None = None,
    ) -> None:
        if token_budget < 1:
            raise ValueError("token_budget must be a positive number of tokens")
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.pack = pack
        self.model_name = model_name
        self.token_budget = token_budget
        self.segmenter = Segmenter(tokenizer, pack, decoder.spec.max_positions)
        self.questions = self.segmenter.questions
        # Maps fixed once per pack and model: applying them is a few flops per choice.
        self.calibration = calibration
        self._maps = calibration.bind(self.questions) if calibration else [None] * len(self.questions)
        self.prefix: PrefixKV | None = self._prefill_preamble()

    @classmethod
    def load(
        cls, model: str, pack: str | Path | Pack, *, token_budget: int = DEFAULT_TOKEN_BUDGET,
        dtype: torch.dtype = torch.float32, device: str = "cpu",
        calibration: str | Path | Calibration | None = "auto",
    ) -> Engine:
        """Resolve ``model`` (alias, HF directory or GGUF file) and ``pack`` (path or name), load.

        ``calibration``: ``"auto"`` (the pack's shipped calibration for this model, if any),
        ``"none"``/``None``, a calibration file, or a :class:`~spinf_stream.calibration.Calibration`.

        Raises:
            spinf_stream.models.weights.ModelNotInstalled, ModelLoadError, PackError,
            spinf_stream.calibration.CalibrationError.
        """
        from transformers import AutoTokenizer

        from . import calibration as cal
        from .models.weights import resolve

        pk = pack if isinstance(pack, Pack) else load_pack(pack)
        resolved = resolve(model)
        chosen = cal.resolve(calibration, pk, resolved)  # before the weights: a wrong file fails fast
        decoder = load_decoder(resolved.path, dtype=dtype, device=device)
        tokenizer = AutoTokenizer.from_pretrained(str(resolved.path))
        return cls(decoder, tokenizer, pk, resolved.name, token_budget, chosen)

    def _prefill_preamble(self) -> PrefixKV | None:
        ids = self.segmenter.preamble_ids
        if not ids:
            return None
        _, kv = self.decoder.forward(preamble_pass(ids), keep_kv=True)
        return kv

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self, messages: Sequence[Message]) -> list[PreparedMessage | ErrorRecord]:
        """Validate and tokenize; cheap, CPU only, safe to call from another thread than ``run``.

        Returns one item per message, in order: a :class:`PreparedMessage` or an
        :class:`ErrorRecord` (``missing_field``, ``wrong_type``, ``empty_field``, ``too_long``,
        ``choice_tokenization``).
        """
        out: list[PreparedMessage | ErrorRecord] = []
        for i, m in enumerate(messages):
            fields: dict[str, str] = {}
            bad: ErrorRecord | None = None
            for name in self.pack.fields:
                if name not in m.fields or m.fields[name] is None:
                    bad = _error(m.id, "missing_field", f"field {name!r} is missing")
                elif not isinstance(m.fields[name], str):
                    bad = _error(
                        m.id, "wrong_type", f"field {name!r} must be a string, got {type(m.fields[name]).__name__}"
                    )
                elif not m.fields[name].strip():
                    bad = _error(m.id, "empty_field", f"field {name!r} is empty")
                if bad:
                    break
                fields[name] = m.fields[name]
            if bad:
                out.append(bad)
                continue
            try:
                out.append(self.segmenter.prepare(i, m.id, fields))
            except LayoutError as e:
                out.append(_error(m.id, e.kind, str(e)))
        return out

    # -- run -------------------------------------------------------------------------------

    def run(self, prepared: Sequence[PreparedMessage]) -> list[ScoreRecord]:
        """Score prepared messages in packed forward passes (blocking; seconds on CPU).

        Returns one :class:`ScoreRecord` per message, in the given order.
        """
        # logprob sums per (message position, question, choice)
        sums: list[dict[int, list[float]]] = [{} for _ in prepared]
        order = {id(p): i for i, p in enumerate(prepared)}
        for works in plan_passes(prepared, self.token_budget):
            layout = build_pass(works)
            hidden, _ = self.decoder.forward(layout, self.prefix)
            rows: list[int] = []
            toks: list[int] = []
            slots: list[tuple[int, int, int]] = []  # (message pos, question, choice) per path step
            for w, offsets in zip(works, layout.read_offsets):
                mi = order[id(w.message)]
                for bi, off in zip(w.branches, offsets):
                    b = w.message.branches[bi]
                    for ci, path in enumerate(b.choices):
                        for read_idx, tok in path:
                            rows.append(off + read_idx)
                            toks.append(tok)
                            slots.append((mi, b.question, ci))
            lps = self.decoder.token_logprobs(
                hidden, torch.tensor(rows, dtype=torch.int64), torch.tensor(toks, dtype=torch.int64)
            ).tolist()
            for (mi, q, ci), lp in zip(slots, lps):
                per_q = sums[mi].setdefault(q, [0.0] * len(self.questions[q].choices))
                per_q[ci] += lp  # float64 sum in token order: deterministic
        return [self._record(p, sums[i]) for i, p in enumerate(prepared)]

    def _record(self, p: PreparedMessage, sums: dict[int, list[float]]) -> ScoreRecord:
        scores: dict[str, Any] = {}
        for qi, q in enumerate(self.questions):
            lps = sums[qi]
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
            scores[q.id] = {"answer": q.choices[best], "choices": choices}
        return ScoreRecord(
            id=p.id,
            pack=PackRef(name=self.pack.name, version=self.pack.version),
            model=self.model_name,
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
