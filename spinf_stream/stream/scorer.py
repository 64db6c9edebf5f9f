"""The stream's one narrow interface to the engine, and the policies it applies around it.

The service needs an object with ``prepare``/``run``/``model_info``/``pack`` (:class:`Scorer`);
:class:`spinf_stream.engine.Engine` is one, tests may pass another. What crosses this seam is
typed: messages in; a :class:`~spinf_stream.engine.segment.PreparedMessage` or an
:class:`~spinf_stream.engine.results.ErrorRecord` per message out of ``prepare``; a
:class:`~spinf_stream.engine.results.ScoreRecord` or an ``ErrorRecord`` per prepared message out of
``run``. This module never touches tensors: it calls the two methods, reads ``cost_tokens`` and
tells records apart from errors.

Both helpers here are blocking; the service calls them in worker threads.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard, runtime_checkable

from spinf_stream.images import is_picture_value
from spinf_stream.engine.results import ErrorInfo, ErrorRecord, ModelRef, QuestionScore, ScoreRecord
from spinf_stream.messages import Message
from spinf_stream.stream.records import Truncation
from spinf_stream.telemetry import EngineWork

if TYPE_CHECKING:  # the engine's tokenized message; its module pulls in the tokenizer library
    from spinf_stream.engine.segment import PreparedMessage

log = logging.getLogger(__name__)


class PackInfo(Protocol):
    """What the stream reads of the scorer's pack."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def fields(self) -> Sequence[str]: ...


@runtime_checkable
class Scorer(Protocol):
    """What the stream needs from the engine (``spinf_stream.engine.Engine`` satisfies it).

    ``prepare(messages)`` tokenizes (cheap, thread-safe) and returns, per message, a
    ``PreparedMessage`` (``cost_tokens``: what it adds to a batch's token budget, its prefill
    tokens and at most its decode steps) or an ``ErrorRecord``.
    ``run(prepared)`` runs the forward passes (blocking) and returns, in order, a ``ScoreRecord``
    or an ``ErrorRecord`` per item. ``model_info`` is the ``model`` block of its records (name,
    weights' sha256, device, dtype, kernels); ``pack`` has ``name``, ``version`` and ``fields``.
    """

    @property
    def model_info(self) -> ModelRef: ...

    @property
    def pack(self) -> PackInfo: ...

    def prepare(self, messages: Sequence[Message]) -> Sequence[PreparedMessage | ErrorRecord]: ...

    def run(self, prepared: Sequence[PreparedMessage]) -> Sequence[ScoreRecord | ErrorRecord]: ...


@runtime_checkable
class BoundsPrefixes(Protocol):
    """A scorer that knows, without tokenizing it all, how much of a field can fit (the engine)."""

    def prefix_chars_bound(self, text: str) -> int: ...


class RunWork(Protocol):
    passes: int
    tokens_computed: int


@runtime_checkable
class ReportsWork(Protocol):
    """A scorer that says what its latest ``run`` computed (the engine's ``last_run``)."""

    @property
    def last_run(self) -> RunWork: ...


#: ``(id, fields) -> message`` for ``Scorer.prepare``; fields are raw JSON values.
MessageFactory = Callable[[str, dict[str, Any]], Message]


def engine_message_factory() -> MessageFactory:
    """``(id, fields) -> spinf_stream.engine.Message`` (imported on first use: it pulls in torch)."""
    from spinf_stream.engine import Message as EngineMessage

    def make(message_id: str, fields: dict[str, Any]) -> Message:
        return EngineMessage(id=message_id, fields=fields)

    return make


def is_error(item: object) -> TypeGuard[ErrorRecord]:
    return isinstance(item, ErrorRecord)


@dataclass(slots=True)
class Prepared:
    """One message's outcome of :func:`prepare_messages`: a prepared message or an error record,
    and the truncation that was applied (``--too-long truncate``)."""

    item: PreparedMessage | ErrorRecord
    truncated: Truncation | None = None


def prepare_messages(
    scorer: Scorer,
    make_message: MessageFactory,
    messages: Sequence[tuple[str, dict[str, Any]]],
    too_long: Literal["truncate", "reject"],
    max_prepare_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Prepared]:
    """``scorer.prepare`` with the over-long policy and the time bound applied. Blocking
    (tokenization).

    With ``truncate``, a message the engine rejects as ``too_long`` is retried with its longest
    field among those the pack uses cut to the longest prefix (in characters, found by bisection)
    that the engine accepts. The search starts below the scorer's ``prefix_chars_bound(text)``
    when it has one (:class:`BoundsPrefixes`; the engine does), so the rest of a huge text is
    never tokenized.

    A message whose preparation takes longer than ``max_prepare_s`` seconds (its tokenization,
    and the search of a prefix) is a ``too_slow`` error record.
    """
    out: list[Prepared] = []
    pack_fields = tuple(scorer.pack.fields)
    bound = scorer.prefix_chars_bound if isinstance(scorer, BoundsPrefixes) else None
    for message_id, fields in messages:
        started = clock()
        deadline = None if max_prepare_s is None else started + max_prepare_s
        over = _over_bound(bound, fields, pack_fields)
        if over is not None:  # too long, known without tokenizing all of it
            name, limit = over
            p = Prepared(ErrorRecord(id=message_id, error=ErrorInfo(kind="too_long", message=(
                f"field {name!r} is {len(fields[name])} characters; no more than {limit} of them fit the model's context"))))
        else:
            p = Prepared(_prepare_one(scorer, make_message(message_id, fields)))
        if too_long == "truncate" and is_error(p.item) and p.item.error.kind == "too_long":
            p = _truncate_to_fit(scorer, make_message, message_id, fields, pack_fields, p, over, deadline, clock)
        if deadline is not None and clock() > deadline:
            took = clock() - started
            p = Prepared(ErrorRecord(id=message_id, error=ErrorInfo(
                kind="too_slow", message=f"preparing the message took over {max_prepare_s:g} s ({took:.1f} s)")))
        out.append(p)
    return out


#: Fields at most this long are tokenized whole before the over-long policy applies; a longer one
#: is first measured against the scorer's ``prefix_chars_bound`` (one tokenization of a prefix).
PRECUT_CHARS = 1 << 16


def _over_bound(
    bound: Callable[[str], int] | None, fields: dict[str, Any], pack_fields: Sequence[str]
) -> tuple[str, int] | None:
    """``(field, chars that can fit)`` of a field so long that no more than a prefix can fit."""
    if bound is None:
        return None
    for name in pack_fields:
        text = fields.get(name)
        if isinstance(text, str) and len(text) > PRECUT_CHARS and not is_picture_value(text):  # not a data URL
            limit = int(bound(text))
            if limit < len(text):
                return name, limit
    return None


def _prepare_one(scorer: Scorer, message: Message) -> PreparedMessage | ErrorRecord:
    items = scorer.prepare([message])
    if len(items) != 1:
        raise RuntimeError(f"engine.prepare returned {len(items)} items for 1 message")
    return items[0]


def _truncate_to_fit(
    scorer: Scorer, make_message: MessageFactory, message_id: str, fields: dict[str, Any],
    pack_fields: Sequence[str], rejected: Prepared, known: tuple[str, int] | None, deadline: float | None,
    clock: Callable[[], float],
) -> Prepared:
    texts = [(len(fields[f]), f) for f in pack_fields if isinstance(fields.get(f), str) and not is_picture_value(fields[f])]
    if not texts:
        return rejected
    length, name = max(texts)  # the longest field: the body, not the title
    text = fields[name]
    if length < 2:
        return rejected
    hi = len(text) - 1
    if known is not None and known[0] == name:  # no prefix longer than the bound can fit
        hi = min(hi, known[1])

    def attempt(n_chars: int) -> PreparedMessage | ErrorRecord:
        return _prepare_one(scorer, make_message(message_id, {**fields, name: text[:n_chars]}))

    best: tuple[int, PreparedMessage] | None = None
    lo = 1
    while lo <= hi:  # largest prefix the engine accepts; acceptance is monotone in the length
        if deadline is not None and clock() > deadline:
            return rejected  # the caller turns it into too_slow
        mid = (lo + hi) // 2
        item = attempt(mid)
        if is_error(item):
            hi = mid - 1
        else:
            best = (mid, item)
            lo = mid + 1
    if best is None:
        return rejected
    kept, found = best
    return Prepared(found, Truncation(field=name, original_chars=len(text), kept_chars=kept))


def run_isolating(scorer: Scorer, prepared: Sequence[PreparedMessage]) -> list[ScoreRecord | ErrorRecord]:
    """``scorer.run(prepared)``; if it raises, run the items one by one so that one message the
    engine cannot handle fails alone (as an ``engine_error`` record) instead of its whole batch.
    An exception with a string ``error_kind`` (a model that failed to load) makes every item an
    error record of that kind, without a retry. Blocking (forward passes)."""
    try:
        records = list(scorer.run(list(prepared)))
        if len(records) != len(prepared):
            raise RuntimeError(f"engine.run returned {len(records)} records for {len(prepared)} items")
        return records
    except Exception as exc:
        kind = getattr(exc, "error_kind", None)
        if isinstance(kind, str):  # the scorer cannot run at all now (its model failed to load): every item
            log.error("%s: %d messages dead-lettered as %s", exc, len(prepared), kind)
            return [ErrorRecord(id=p.id, error=ErrorInfo(kind=kind, message=str(exc)[:1000])) for p in prepared]
        if len(prepared) == 1:
            log.exception("engine failed on one message")
            return [
                ErrorRecord(
                    id=prepared[0].id,
                    error=ErrorInfo(kind="engine_error", message=f"{type(exc).__name__}: {exc}"[:1000]),
                )
            ]
        log.warning("engine failed on a batch of %d (%s); retrying one by one", len(prepared), type(exc).__name__)
        out: list[ScoreRecord | ErrorRecord] = []
        for item in prepared:
            out.extend(run_isolating(scorer, [item]))
        return out


def run_measured(
    scorer: Scorer, prepared: Sequence[PreparedMessage]
) -> tuple[list[ScoreRecord | ErrorRecord], float, EngineWork]:
    """:func:`run_isolating`, timed: ``(records, seconds, work)``. ``work`` is what the engine
    reports of its latest run (``Engine.last_run``, :class:`ReportsWork`: passes, tokens
    computed), or unknown for a scorer that does not say; after a one-by-one retry it covers the
    last item only. Blocking."""
    t0 = time.perf_counter()
    records = run_isolating(scorer, prepared)
    seconds = time.perf_counter() - t0
    if isinstance(scorer, ReportsWork):
        last = scorer.last_run
        work = EngineWork(last.passes, last.tokens_computed, getattr(last, "decode_passes", None),
                          getattr(last, "extracted_tokens", None))
    else:
        work = EngineWork(None, None)
    return records, seconds, work


def questions_answered(records: Sequence[ScoreRecord | ErrorRecord]) -> int:
    """Questions answered by ``records`` (each score record's ``scores`` has one entry per question)."""
    return sum(len(r.scores) for r in records if isinstance(r, ScoreRecord))


def answer_counts(records: Sequence[ScoreRecord | ErrorRecord]) -> Counter[tuple[str, str, str]]:
    """``{(pack, question id, answer): n}`` over the score records: a choice question's answer
    (one of its labels), an extraction's ``value`` or ``none`` (never the value itself)."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for r in records:
        if isinstance(r, ScoreRecord):
            for qid, s in r.scores.items():
                answer = s.answer if isinstance(s, QuestionScore) else ("none" if s.answer is None else "value")
                counts[(r.pack.name, qid, answer)] += 1
    return counts


def scorer_info(scorer: Scorer) -> dict[str, str]:
    """``{model, pack, pack_version, device, dtype, kernels}`` of a scorer, as strings, for the
    ``spinf.info`` metric: from its ``model_info`` block (the one written in every record;
    ``unknown`` for a scorer built without one)."""
    info: ModelRef | None = scorer.model_info
    return {
        "model": info.name if info is not None else "unknown",
        "pack": str(scorer.pack.name),
        "pack_version": str(scorer.pack.version),
        "device": info.device if info is not None else "unknown",
        "dtype": info.dtype if info is not None else "unknown",
        "kernels": info.kernels if info is not None else "unknown",
    }
