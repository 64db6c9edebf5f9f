"""Requests as micro-batch work: each request's messages are prepared (tokenized) off the event
loop, queued on their lane (one per pack and calibration), and batched onto the engine thread by
the stream's :class:`~spinf_stream.stream.scheduler.Scheduler` (latency window ``window_s``,
default 5 ms, token budget, message cap). A message's record is what the same lane gives it in
any batch: scores are bitwise independent of what shares a pass.

The queue is bounded: a request that would take it past ``max_queued`` messages is refused with
:class:`QueueFull` (HTTP 429), never held in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from spinf_stream.engine.results import ErrorInfo, ErrorRecord, ScoreRecord
from spinf_stream.messages import Rejection, read_id
from spinf_stream.stream.engine_thread import EngineThread
from spinf_stream.stream.scheduler import Scheduler
from spinf_stream.stream.scorer import Scorer, engine_message_factory, is_error, prepare_messages, run_isolating

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """The request would take the queue past its bound (HTTP 429)."""


class BadRequest(ValueError):
    """A request that cannot be read (HTTP 400), naming the parameter at fault."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class UnknownLane(LookupError):
    """No served pack (or calibration) matches what the request names (HTTP 404)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Lane:
    """A served (pack, calibration) and the scorer that reads it."""

    key: str
    pack: str
    version: str
    calibration: str
    scorer: Scorer

    @property
    def model(self) -> str:
        return str(self.scorer.model_info.name)


@dataclass
class _Item:
    prepared: Any
    future: asyncio.Future[ScoreRecord | ErrorRecord]
    queued_at: float = 0.0  # the event loop's clock
    request: Any = None  # its request's span context (telemetry), to link its batch to


@dataclass(frozen=True)
class Scored:
    """A request's records (one per message, in order) and its token counts."""

    records: list[dict[str, Any]]
    prompt_tokens: int
    computed_tokens: int


def message_id(index: int, fields: Mapping[str, Any]) -> str | ErrorRecord:
    """A message's id: its ``id`` field (as on the input topic, :func:`~spinf_stream.messages.read_id`)
    or its index in the request; an error record when the field cannot be an id."""
    found = read_id(fields)
    if isinstance(found, Rejection):
        return ErrorRecord(id=str(index), error=ErrorInfo(kind=found.kind, message=found.message))
    return str(index) if found is None else found


class ApiScoring:
    """Scores requests on ``lanes`` (one model), batched onto ``engine_thread``.

    Args:
        lanes: the served lanes; the first of each pack with ``calibration`` the server's default.
        engine_thread: the thread that owns the device (shared with the stream when there is one).
        token_budget, max_batch_messages: a batch's bounds (as the stream's).
        window_s: how long a lone request waits for others to share its pass (seconds).
        max_queued: messages waiting at most (over every lane).
        too_long: ``reject`` or ``truncate`` (as ``--too-long``).
        max_prepare_s: as ``--max-prepare-s``.
    """

    def __init__(
        self, lanes: Sequence[Lane], engine_thread: EngineThread, *, token_budget: int, max_batch_messages: int = 512,
        window_s: float = 0.005, max_queued: int = 4096, too_long: Literal["truncate", "reject"] = "reject",
        max_prepare_s: float | None = None, on_batch: Callable[[str, int, float], None] | None = None,
        telemetry: Any = None, inline_packs: bool = True, max_inline_packs: int = 16,
    ) -> None:
        self.lanes = {lane.key: lane for lane in lanes}
        self.engine_thread = engine_thread
        self.token_budget = token_budget
        self.max_queued = max_queued
        self.too_long = too_long
        self.max_prepare_s = max_prepare_s
        self._make_message = engine_message_factory()
        self._scheduler: Scheduler[_Item] = Scheduler(
            {k: token_budget for k in self.lanes}, max_batch_messages, window_s,
            loaded=lambda k: bool(getattr(self.lanes[k].scorer, "loaded", True)))
        self._queued = 0
        self._on_batch = on_batch
        self._telemetry = telemetry
        self.inline_packs = inline_packs
        self.max_inline_packs = max_inline_packs
        self._max_batch_messages = max_batch_messages
        self._window_s = window_s
        self._inline: dict[str, asyncio.Task[Lane]] = {}  # key -> its lane being built or built, oldest first
        self._task: asyncio.Task[None] | None = None

    # -- lanes --------------------------------------------------------------------------------

    def lane_for(self, pack: str, calibration: str | None, model: str | None = None) -> Lane:
        """The lane of ``pack`` (``name`` or ``name@version``) on ``model`` (``None``: the
        first that serves the pack) with ``calibration`` (``None``: the first of those).
        Raises :class:`UnknownLane`."""
        name, _, version = pack.partition("@")
        found = [lane for lane in self.lanes.values() if lane.pack == name and (not version or lane.version == version)]
        if not found:
            served = ", ".join(sorted({f"{lane.pack}@{lane.version}" for lane in self.lanes.values()}))
            raise UnknownLane("pack", f"pack {pack!r} is not served here; served: {served}")
        if model is not None:
            on = [lane for lane in found if lane.model == model]
            if not on:
                served = ", ".join(sorted({lane.model for lane in found}))
                raise UnknownLane("model", f"model {model!r} does not serve pack {pack!r} here; served: {served}")
            found = on
        if calibration is None:
            return found[0]
        for lane in found:
            if lane.calibration == calibration:
                return lane
        raise UnknownLane("calibration", f"calibration {calibration!r} is not served for pack {pack!r}")

    async def inline_lane(self, pack: Mapping[str, Any], calibration: str | None, model: str | None = None) -> Lane:
        """The lane of a pack given in the request (its YAML as a JSON object) on ``model`` (``None``:
        the first served): built on first use (an engine over the model's loaded decoder, its
        preamble prefilled on the engine thread), kept for the next requests (at most
        ``max_inline_packs``; the oldest idle one goes). Uncalibrated.

        Raises:
            BadRequest: inline packs are off, a calibration other than ``none``, or a pack that does
                not validate (the message names the key).
            UnknownLane: a model not served.
        """
        from spinf_stream.packs.load import PackError, parse_pack  # pydantic and yaml: on first use only

        if not self.inline_packs:
            raise BadRequest("pack", "inline packs are turned off here (--no-api-inline-packs): name a served pack")
        if calibration not in (None, "none"):
            raise BadRequest("calibration", "an inline pack has no calibration: leave calibration out or give none")
        base = next((lane for lane in self.lanes.values() if model is None or lane.model == model), None)
        if base is None:
            raise UnknownLane("model", f"model {model!r} is not served here; served: {', '.join(sorted({lane.model for lane in self.lanes.values()}))}")
        try:
            text = orjson.dumps(dict(pack), option=orjson.OPT_SORT_KEYS).decode()
        except TypeError as e:  # an integer over 64 bits
            raise BadRequest("pack", f"pack: {e}") from None
        key = f"inline|{hashlib.sha256(text.encode()).hexdigest()[:16]}|{base.model}"
        task = self._inline.get(key)
        if task is None:
            try:
                parsed = parse_pack(text, source="pack")
            except PackError as e:
                raise BadRequest("pack", str(e)) from None
            task = self._inline[key] = asyncio.create_task(self._build_inline(key, parsed, base))
            self._drop_idle_inline()
        try:
            return await asyncio.shield(task)
        except BadRequest:
            self._inline.pop(key, None)
            raise

    async def _build_inline(self, key: str, pack: Any, base: Lane) -> Lane:
        try:
            engine = await self.engine_thread.run(_inline_engine, base.scorer, pack, self.token_budget)
        except ValueError as e:  # the pack's choices against this tokenizer, its views
            raise BadRequest("pack", f"pack: {e}") from None
        lane = Lane(key, str(pack.name), str(pack.version), "none", engine)
        self.lanes[key] = lane
        self._scheduler.add_lane(key, self.token_budget, self._max_batch_messages, self._window_s)
        return lane

    def _drop_idle_inline(self) -> None:
        for key in list(self._inline)[: max(0, len(self._inline) - self.max_inline_packs)]:
            if self._inline[key].done() and self._scheduler.remove_lane(key):
                del self._inline[key]
                self.lanes.pop(key, None)

    # -- requests -----------------------------------------------------------------------------

    async def score(self, lane: Lane, messages: Sequence[Mapping[str, Any]]) -> Scored:
        """Score ``messages`` on ``lane``: their records, in order. Raises :class:`QueueFull`.
        Cancelling the call (a timeout, a client gone) drops its messages that have not run."""
        if self._queued + len(messages) > self.max_queued:
            raise QueueFull(f"{self._queued} messages are queued; {len(messages)} more would pass the bound of {self.max_queued}")
        ids = [message_id(i, m) for i, m in enumerate(messages)]
        todo = [(mid, dict(m)) for mid, m in zip(ids, messages) if isinstance(mid, str)]
        self._queued += len(todo)
        items: list[_Item] = []
        try:
            prepared = await asyncio.to_thread(
                prepare_messages, lane.scorer, self._make_message, todo, self.too_long, self.max_prepare_s)
            loop = asyncio.get_running_loop()
            it = iter(prepared)
            records: list[ScoreRecord | ErrorRecord | asyncio.Future[ScoreRecord | ErrorRecord]] = []
            truncated: dict[int, Any] = {}
            prompt = computed = 0
            for i, mid in enumerate(ids):
                if not isinstance(mid, str):
                    records.append(mid)
                    continue
                p = next(it)
                if p.truncated is not None:
                    truncated[i] = p.truncated
                if is_error(p.item):
                    records.append(p.item)
                    continue
                prompt += getattr(p.item, "prefix_len", 0) + int(p.item.n_tokens)
                computed += int(p.item.cost_tokens)
                item = _Item(p.item, loop.create_future(), loop.time(),
                             self._telemetry.request_context() if self._telemetry is not None else None)
                items.append(item)
                self._scheduler.add(lane.key, item, int(p.item.cost_tokens))
                records.append(item.future)
            self._queued -= len(todo) - len(items)
            out: list[dict[str, Any]] = []
            for i, r in enumerate(records):
                rec = await r if isinstance(r, asyncio.Future) else r
                out.append(_plain(rec, truncated.get(i)))
            return Scored(out, prompt, computed)
        finally:
            waiting = {id(it) for it in items if not it.future.done()}
            if waiting:  # cancelled: what has not run leaves the queue
                dropped = self._scheduler.discard(lambda it: id(it) in waiting)
                self._queued -= len(dropped)
                for it in items:
                    it.future.cancel()

    # -- the batch loop -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the batch loop in the running event loop."""
        self._task = asyncio.create_task(self._batches(), name="spinf-api-batches")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            got = await self._scheduler.next_batch()
            if got is None:
                continue
            key, batch = got
            self._queued -= len(batch)
            live = [it for it in batch if not it.future.done()]
            if not live:
                continue
            started = loop.time()
            span = None
            if self._telemetry is not None:
                lane = self.lanes[key]
                span = reported("api_batch_started", self._telemetry.api_batch_started, [started - it.queued_at for it in live],
                                 [it.request for it in live], pack=lane.pack, model=lane.model)
            try:
                records = await self.engine_thread.run(run_isolating, self.lanes[key].scorer, [it.prepared for it in live])
            except Exception as exc:  # the engine thread is gone: every waiting request fails, not hangs
                log.exception("API batch failed")
                for it in live:
                    if not it.future.done():
                        it.future.set_exception(exc)
                continue
            finally:
                if self._telemetry is not None:
                    reported("api_batch_finished", self._telemetry.api_batch_finished, span)
            if self._on_batch is not None:
                reported("on_batch", self._on_batch, key, len(live), loop.time() - started)
            for it, rec in zip(live, records):
                if not it.future.done():
                    it.future.set_result(rec)


def reported(hook: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, the telemetry ``hook``: an exception is logged naming it, never
    raised (a broken exporter must not stop the batches; the requests are answered), and gives
    ``None``."""
    try:
        return fn(*args, **kwargs)
    except Exception:
        log.exception("API telemetry failed in %s", hook)
        return None


def _inline_engine(scorer: Any, pack: Any, token_budget: int) -> Any:
    """An engine for ``pack`` over ``scorer``'s model (engine thread: its decoder, loaded if need be)."""
    from spinf_stream.engine import Engine

    info = scorer.model_info
    return Engine(scorer.loaded_decoder(), scorer.tokenizer, pack, str(info.name), token_budget,
                  model_sha256=info.sha256, dtype_name=info.dtype)


def _plain(rec: ScoreRecord | ErrorRecord, truncated: Any) -> dict[str, Any]:
    """A record as ``spinf-stream score`` writes it (plus ``truncated`` when the text was cut)."""
    if isinstance(rec, ErrorRecord):
        return rec.model_dump(mode="json", exclude_none=True)
    plain = rec.model_dump(mode="json")
    if truncated is not None:
        plain["truncated"] = truncated.model_dump(mode="json")
    return plain
