"""The scoring service: consume → decode → prepare → micro-batch → engine → produce → commit.

:class:`ScoringService` coordinates: it starts the Kafka clients and its tasks, polls, applies
backpressure, ingests what a poll returns, keeps the engine busy, and stops. Its parts: what is in
flight (:mod:`~spinf_stream.stream.inflight`), tokenization (:mod:`~spinf_stream.stream.preparer`),
writing the records (:mod:`~spinf_stream.stream.writer`), committing
(:mod:`~spinf_stream.stream.committer`), rebalances (:mod:`~spinf_stream.stream.rebalance`), lag
sampling (:mod:`~spinf_stream.stream.lag`), which partitions to pause
(:mod:`~spinf_stream.stream.backpressure`).

One asyncio task polls the consumer without pause — also while the engine runs, while a message
is tokenized and while the partitions are paused for backpressure — so the member never misses
``max.poll.interval.ms`` and never leaves its group because a batch or a message is slow. The
engine runs in its own thread; tokenization (``prepare``) in another, fed by its own task, so the
next batch is fetched and tokenized while the current one runs and the poll loop never waits on it.

No record stops a partition: a value over ``--max-message-bytes`` is dead-lettered unread, a
message whose preparation outlasts ``--max-prepare-s`` is dead-lettered ``too_slow``, a record the
Kafka client cannot parse is dead-lettered ``undecodable_record``
(:mod:`~spinf_stream.stream.fetch_guard`), a dead letter is cut to fit the size the producer and
topic accept (:mod:`~spinf_stream.stream.dlq`), a score record over it becomes a
``record_too_large`` dead letter, and a record the broker still refuses for its size is reported
and skipped.

Threads: README, "The service".

Keeping the engine busy: with a backlog, a batch fills the token budget (the latency window holds
for input that trickles in, not for records already read or waiting in the broker; see
:mod:`~spinf_stream.stream.batcher`), and when a batch finishes the next one goes to the engine
before the finished one's records are built, written and acknowledged.

Routes and lanes: a record is scored by every pack of its route
(:mod:`~spinf_stream.stream.routing`), each pack by its *lane* (a scorer: one pack on one model,
with its token budget and calibration) with its own micro-batcher; the engine thread runs one
lane's batch at a time, picked by :mod:`~spinf_stream.stream.scheduler`'s policy. One scorer given
alone makes the one route of the flags.

Delivery (at-least-once):

- every consumed record gets one written record per pack of its route: a score on that pack's
  output topic or a dead-letter record for that pack (a record no pack can read gets one dead
  letter); they are written in input order per partition, keyed like the input;
- a partition's offset is committed only up to its highest contiguous offset whose written records
  the broker all acknowledged;
- on a rebalance, in-flight work of revoked partitions is finished (up to a grace period) or
  dropped, and what was acknowledged is committed, before the partitions move;
- :meth:`ScoringService.stop` (SIGTERM/SIGINT) drains: no new records, the open batch runs at
  once, everything is written and acknowledged, offsets are committed, the clients close.

A failure to write other than for size (the producer gives up) stops the service with an error and
commits nothing past the failed record; a restart rescores from there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from spinf_stream.config import RunSettings
from spinf_stream.engine.results import ErrorRecord, ModelRef, ScoreRecord
from spinf_stream.messages import text_field
from spinf_stream.stream import backpressure, fetch_guard
from spinf_stream.stream.codec import TEXT_FIELD, Rejection, decode_record
from spinf_stream.stream.committer import Committer
from spinf_stream.stream.engine_thread import EngineThread
from spinf_stream.stream.inflight import Entry, Inflight, Record
from spinf_stream.stream.lag import LagSampler, more_in_broker
from spinf_stream.stream.preparer import Preparer
from spinf_stream.stream.rebalance import Rebalance
from spinf_stream.stream.routing import Router, StreamRoute, Target
from spinf_stream.stream.scheduler import Scheduler
from spinf_stream.stream.scorer import (
    MessageFactory,
    Scorer,
    engine_message_factory,
    answer_counts,
    questions_answered,
    run_measured,
    scorer_info,
)
from spinf_stream.stream.stats import ServiceStats
from spinf_stream.stream.writer import ProduceFailed, Writer, record_limit
from spinf_stream.telemetry import EngineWork, StreamTelemetry

if TYPE_CHECKING:
    from spinf_stream.telemetry.recorder import BatchTrace

__all__ = ["ProduceFailed", "ScoringService", "ServiceStats"]

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 100
#: While no batch is ready, the engine thread runs the housekeeping (idle model eviction) this often (s).
HOUSEKEEPING_S = 1.0
#: The lane key of a scorer given alone (the one route of the flags).
DEFAULT_LANE = "default"
#: After :meth:`ScoringService.abort`: the longest wait for the producer's flush, and for the
#: final commit, each (s).
ABORT_WAIT_S = 5.0


@dataclass(eq=False, slots=True)
class _Running:
    """A batch in the engine: its lane, its entries (slot, target index, prepared message), packed
    tokens, telemetry trace, and the future of ``run_measured``."""

    lane: str
    live: list[Entry]
    tokens: int
    trace: BatchTrace
    future: asyncio.Future[tuple[list[ScoreRecord | ErrorRecord], float, EngineWork]]


class ScoringService:
    """Scores the input topics of ``settings`` with ``scorer`` until :meth:`stop` (or a failure).

    One piece (about 320 lines): the coordinator, each method one step of its loop; every other
    concern is in the class it delegates to.

    Args:
        settings: topics, group, batching and Kafka client settings.
        scorer: the engine (see :class:`spinf_stream.stream.scorer.Scorer`) of the one route the
            flags make (``--input-topic`` → ``--output-topic``); or give ``lanes`` and ``router``.
        lanes: each lane's scorer, by lane key; a scorer with a ``loaded`` attribute says whether
            its model is in memory (:mod:`~spinf_stream.stream.scheduler`).
        router: the routes, their targets naming the lanes.
        budgets: each lane's token budget (default ``--token-budget``).
        housekeeping: run on the engine thread about every :data:`HOUSEKEEPING_S` while no batch
            is ready (the engine pool's idle eviction).
        fairness_cap, swap_wait_s: the scheduling policy's (:class:`~spinf_stream.stream.scheduler.Scheduler`).
        make_message: ``(id, fields) -> message`` for ``scorer.prepare``; default: the engine's
            ``Message``.
        settle_timeout_s: on a rebalance, how long to wait for in-flight work of revoked
            partitions to be written before dropping it (default: a quarter of
            ``max_poll_interval_ms``, at most 30 s).
        telemetry: metrics, traces and health (default: off, health state only).
        engine_thread: the thread the engine's forward passes run on; give the one the engine
            was loaded on (see :mod:`~spinf_stream.stream.engine_thread`). Default: a new one,
            closed when :meth:`run` ends (a given one is left open).
    """

    def __init__(
        self,
        settings: RunSettings,
        scorer: Scorer | None = None,
        *,
        lanes: Mapping[str, Scorer] | None = None,
        router: Router | None = None,
        budgets: Mapping[str, int] | None = None,
        make_message: MessageFactory | None = None,
        settle_timeout_s: float | None = None,
        telemetry: StreamTelemetry | None = None,
        engine_thread: EngineThread | None = None,
        housekeeping: Callable[[], object] | None = None,
        fairness_cap: int = 4,
        swap_wait_s: float = 2.0,
    ) -> None:
        if (scorer is None) == (lanes is None) or (lanes is None) != (router is None):
            raise TypeError("give a scorer, or lanes and a router")
        if scorer is not None:
            lanes = {DEFAULT_LANE: scorer}
            router = Router([StreamRoute(
                frozenset(settings.input_topic), (),
                (Target(DEFAULT_LANE, str(scorer.pack.name), str(scorer.pack.version), settings.output_topic),),
            )])
        assert lanes is not None and router is not None
        self.settings = settings
        self.lanes = dict(lanes)
        self.router = router
        self.scorer = next(iter(self.lanes.values()))
        self.telemetry = telemetry if telemetry is not None else StreamTelemetry.off()
        self._budgets = {k: (budgets or {}).get(k, settings.token_budget) for k in self.lanes}
        self._info = {k: scorer_info(s) for k, s in self.lanes.items()}  # pack and model of each lane's metrics
        for k in self.lanes:
            self.telemetry.scorer_ready({**self._info[k], "token_budget": str(self._budgets[k])})
        self._make_message = make_message
        self.stats = ServiceStats()
        self._settle_timeout_s = (
            settle_timeout_s if settle_timeout_s is not None else min(30.0, settings.max_poll_interval_ms / 4000)
        )
        # --input-format text: each value is the text of the one field of each lane's pack;
        # image: a picture, in the first field of each lane's pack
        text_fields = (
            {k: text_field(tuple(s.pack.fields), str(s.pack.name)) for k, s in self.lanes.items()}
            if settings.input_format == "text"
            else {k: str(s.pack.fields[0]) for k, s in self.lanes.items()} if settings.input_format == "image" else None
        )
        self._inflight = Inflight()
        self._scheduler: Scheduler[Entry] = Scheduler(
            self._budgets, settings.max_batch_messages,
            settings.window_ms / 1000, loaded=self._lane_loaded, fairness_cap=fairness_cap, swap_wait_s=swap_wait_s,
        )
        self._housekeeping = housekeeping
        self._writer = Writer(settings, self._model_of, self.telemetry, self.stats, self._inflight, self._fail)
        self._preparer = Preparer(settings, self.lanes, self._scheduler, self._writer, self._update_backlog, text_fields)
        self._stop_requested = asyncio.Event()
        self._fatal: BaseException | None = None
        self._aborting = False
        self._ingesting = 0
        self._broker_backlog = False  # the latest poll left records in the broker (not paused)
        self.assigned = asyncio.Event()  # set on the first assignment (tests, dev)
        self.drained = False  # after run(): everything consumed was written before the stop
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._owns_engine_thread = engine_thread is None
        self._engine_thread = engine_thread if engine_thread is not None else EngineThread()
        fetch_guard.install()

    def _queue_depths(self) -> tuple[tuple[str, str, int], ...]:
        depths = self._scheduler.depths()
        return tuple((self._info[k]["pack"], self._info[k]["model"], n) for k, n in depths.items())

    def _model_of(self, lane: str) -> ModelRef | None:
        return self.lanes[lane].model_info

    def _lane_loaded(self, lane: str) -> bool:
        return bool(getattr(self.lanes[lane], "loaded", True))

    # -- lifecycle ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop (drain, write, commit, close). Safe from a signal handler."""
        if not self._stop_requested.is_set():
            log.info("stop requested: draining")
        self._stop_requested.set()
        self.telemetry.health.stopping()

    def abort(self) -> None:
        """Stop without draining (a second SIGTERM/SIGINT): the caller cancels :meth:`run`; what
        was written is flushed and what was acknowledged committed, each for at most
        :data:`ABORT_WAIT_S`."""
        self._aborting = True
        self.stop()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stop_requested.is_set()

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        return self._consumer

    async def wait_acked(self, n: int) -> None:
        """Wait (without polling) until the broker has acknowledged ``n`` written records since
        :meth:`run` started (``stats.acked``). Raises the service's failure if it fails first."""
        progress = self._inflight.progress
        while self.stats.acked < n:
            if self._fatal is not None:
                raise self._fatal
            progress.clear()
            await progress.wait()

    async def run(self) -> None:
        """Run until :meth:`stop` has drained everything, or raise on a failure."""
        s = self.settings
        if self._make_message is None:
            self._make_message = engine_message_factory()
        kafka = s.client_kwargs()  # one SSL context for both clients
        producer = self._producer = _producer(s, kafka)
        consumer = self._consumer = _consumer(s, kafka)
        committer = Committer(consumer, self._inflight, self.stats, self.telemetry, s.commit_interval_ms / 1000)
        rebalance = Rebalance(
            self._inflight, committer, self._scheduler, self.stats, self.telemetry,
            settle_timeout_s=self._settle_timeout_s, failed=lambda: self._fatal is not None,
            revoking=self._rebalancing, assigned=self.assigned,
        )
        lag = LagSampler(consumer, self._inflight, self.stats, self.telemetry, s.auto_offset_reset, self._queue_depths)
        await producer.start()
        self._writer.max_record_bytes = await self._record_limit()
        tasks: list[asyncio.Task[None]] = []
        graceful = False
        try:
            topics = list(dict.fromkeys(t for r in self.router.routes for t in sorted(r.topics)))
            consumer.subscribe(topics, listener=rebalance)
            await consumer.start()
            self.telemetry.health.consumer_started()
            for route in self.router.routes:
                for target in route.targets:
                    m = self._model_of(target.lane)
                    log.info(
                        "scoring %s -> %s (dead letters: %s) as group %s with pack %s@%s, model %s on %s (%s)",
                        ",".join(sorted(route.topics)), target.output_topic, s.dlq_topic, s.group_id, target.pack_name,
                        target.pack_version, m.name if m else "?", m.device if m else "?", m.dtype if m else "?",
                    )
            tasks = [
                asyncio.create_task(self._guard(self._preparer.run(self._make_message)), name="spinf-prepare"),
                asyncio.create_task(self._guard(self._engine_loop()), name="spinf-engine"),
                asyncio.create_task(self._guard(self._writer.run(producer)), name="spinf-send"),
                asyncio.create_task(self._guard(committer.run()), name="spinf-commit"),
                asyncio.create_task(lag.run(), name="spinf-telemetry"),
            ]
            graceful = self.drained = await self._poll_loop(consumer)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._close(graceful, committer)
        if self._fatal is not None:
            raise self._fatal

    async def _record_limit(self) -> int:
        """The largest record to write (bytes): see :func:`~spinf_stream.stream.writer.record_limit`."""
        return await record_limit(self.settings, [*self.router.output_topics, self.settings.dlq_topic])

    async def _close(self, graceful: bool, committer: Committer) -> None:
        wait = ABORT_WAIT_S if self._aborting else None
        try:
            if self._fatal is None and self._producer is not None:
                await asyncio.wait_for(self._producer.flush(), wait)
            await asyncio.wait_for(committer.commit(), wait)
        except Exception as exc:  # closing must go on: log and keep closing
            log.warning("final commit failed: %s", exc)
        finally:
            if self._consumer is not None:
                await self._consumer.stop()
            if self._producer is not None:
                await self._producer.stop()
            if self._owns_engine_thread:
                self._engine_thread.close()
            self._preparer.close()
        log.info(
            "stopped%s: consumed %d, scored %d, dead-lettered %d, committed %s",
            "" if graceful else " (not drained)",
            self.stats.consumed, self.stats.scored, self.stats.dead_lettered,
            {f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(self.stats.committed.items())},
        )

    async def _guard(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._fatal is None:
            log.error("scorer failing: %s: %s", type(exc).__name__, exc)
            self._fatal = exc
            self.telemetry.failed(exc)
        self._inflight.progress.set()

    def _unacked(self) -> int:
        return self._inflight.unacked()

    # -- consume ------------------------------------------------------------------------------

    async def _poll_loop(self, consumer: AIOKafkaConsumer) -> bool:
        """Poll until stopped; True when everything consumed was written (drained)."""
        s = self.settings
        deadline: float | None = None
        health = self.telemetry.health
        while True:
            health.beat()
            if self._fatal is not None:
                return False
            if self._stop_requested.is_set():
                if deadline is None:
                    deadline = time.monotonic() + s.shutdown_timeout_s
                    self._scheduler.drain()
                if self._unacked() == 0 and self._ingesting == 0:
                    return True
                if time.monotonic() > deadline:
                    log.warning("shutdown timeout: %d records not written; their offsets stay uncommitted", self._unacked())
                    return False
            self._backpressure(consumer)
            # At most one partition's share a poll, so one partition rarely fills the room of all.
            room = min(s.max_inflight - self._unacked(), backpressure.share(s.max_inflight, len(consumer.assignment())))
            # Poll even when every partition is paused: that keeps this member in its group.
            data = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=max(1, room))
            # A poll that returns nothing ends any claim of records waiting in the broker (the high
            # watermark overstates it on compacted or transactional topics).
            self._broker_backlog = bool(data) and more_in_broker(consumer, self._inflight)
            self._update_backlog()
            if data:
                self._ingesting += 1
                try:
                    await self._ingest(data)
                finally:
                    self._ingesting -= 1

    def _update_backlog(self) -> None:
        """Tell the batcher whether input is already there: records being tokenized, or waiting
        in the broker. While it is, a partial batch is held past its window."""
        self._scheduler.set_backlog(self._preparer.pending > 0 or self._broker_backlog)

    def _rebalancing(self) -> None:
        # No poll returns while the group rebalances: a claim of records waiting in the broker
        # would hold a partial batch that the revoked partitions' work may be waiting for.
        self._broker_backlog = False
        self._update_backlog()

    def _backpressure(self, consumer: AIOKafkaConsumer) -> None:
        """Pause the partitions whose records in flight reach their share of ``--max-inflight``
        (every one at the total or while stopping), resume those drained to half of it."""
        assigned, paused = consumer.assignment(), consumer.paused()
        inflight = {p.tp: p.offsets.unacked for p in self._inflight.live()}
        d = backpressure.decide(inflight, assigned, paused, self.settings.max_inflight, self._stop_requested.is_set())
        if d.pause:
            consumer.pause(*d.pause)
            if not self._stop_requested.is_set():
                log.debug("backpressure: %d in flight, %d partitions paused", sum(inflight.values()), len(paused | d.pause))
        if d.resume:
            consumer.resume(*d.resume)

    async def _ingest(self, data: dict[TopicPartition, list[Record]]) -> None:
        """Track, decode and queue the records of one poll for tokenization; dead-letter those
        that are no message. Never waits on tokenization (the prepare loop does it)."""
        s = self.settings
        writer = self._writer
        now = time.monotonic()
        queued = 0
        for tp, records in data.items():
            part = self._inflight.take(tp)
            fresh = 0
            for rec in records:
                slot = self._inflight.track(part, rec, now)
                if slot is None:
                    continue  # already in flight (re-delivery after a seek)
                fresh += 1
                self.stats.consumed += 1
                if self.stats.first_consumed_at is None:
                    self.stats.first_consumed_at = time.monotonic()
                decoded = decode_record(
                    rec, input_format=s.input_format, text_field=TEXT_FIELD, max_bytes=s.max_message_bytes,
                )
                routed = self.router.route(rec.topic, rec.headers)
                if isinstance(routed, Rejection):  # dead letters name the pack when the route has one
                    slot.owe(self.router.candidates(rec.topic, rec.headers))
                    given = decoded.id if not isinstance(decoded, Rejection) and decoded.id_given else None
                    writer.dead_letter(slot, routed.kind, routed.message, message_id=given)
                    continue
                slot.owe(routed)
                if isinstance(decoded, Rejection):
                    policy = s.too_long if decoded.kind == "too_long" else None
                    writer.dead_letter(slot, decoded.kind, decoded.message, message_id=decoded.id, policy=policy)
                else:
                    slot.message_id = decoded.id
                    self._preparer.put(slot, decoded.id, decoded.fields)
                    queued += 1
            self.telemetry.consumed(tp.topic, tp.partition, fresh)
        for tp in data:  # dead letters at the head of a partition can go now
            held = self._inflight.parts.get(tp)
            if held is not None:
                writer.release(held)
        if queued:  # until they are tokenized, the batcher holds a partial batch (backlog)
            self._update_backlog()

    # -- engine -------------------------------------------------------------------------------

    async def _engine_loop(self) -> None:
        """Keep the engine busy: when a batch finishes, the next one (if ready) goes to the engine
        thread before the finished batch's records are built and written. While none is ready,
        the housekeeping runs on the engine thread about every :data:`HOUSEKEEPING_S`."""
        running: _Running | None = None
        wait = HOUSEKEEPING_S if self._housekeeping is not None else None
        while True:
            if running is None:
                got = await self._scheduler.next_batch(wait)
                if got is None:
                    assert self._housekeeping is not None
                    await self._engine_thread.run(self._housekeeping)
                    continue
                running = self._start_batch(*got)
                continue
            records, seconds, work = await running.future
            done = running
            self.stats.engine_seconds += seconds
            self.telemetry.batch_finished(
                done.trace, seconds, questions_answered(records), work, done.tokens,
                written=sum(not slot.part.revoked for slot, _, _ in done.live),
            )
            self.telemetry.answered(answer_counts(records))
            ready = self._scheduler.take()
            running = self._start_batch(*ready) if ready is not None else None
            self._writer.batch_done([(slot, i) for slot, i, _ in done.live], records, done.trace)

    def _start_batch(self, lane: str, batch: list[Entry]) -> _Running | None:
        """Hand ``lane``'s ``batch`` (less the records of revoked partitions) to the engine thread."""
        live = [e for e in batch if not e[0].part.revoked]
        if not live:
            return None
        tokens = sum(int(item.cost_tokens) for _, _, item in live)
        self.stats.batches += 1
        self.stats.batch_messages += len(live)
        self.stats.batch_tokens += tokens
        started = time.monotonic()
        info = self._info[lane]
        trace = self.telemetry.batch_started(
            [slot.record.headers for slot, _, _ in live], [started - slot.read_at for slot, _, _ in live], tokens,
            pack=info["pack"], model=info["model"], token_budget=self._budgets[lane],
        )
        future = self._engine_thread.run(run_measured, self.lanes[lane], [item for _, _, item in live])
        return _Running(lane, live, tokens, trace, future)


def _producer(s: RunSettings, kafka: dict[str, Any]) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        **kafka, acks="all", enable_idempotence=s.enable_idempotence, linger_ms=5,
        max_request_size=s.max_request_size,
    )


def _consumer(s: RunSettings, kafka: dict[str, Any]) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        **kafka,
        group_id=s.group_id,
        enable_auto_commit=False,
        auto_offset_reset=s.auto_offset_reset,
        session_timeout_ms=s.session_timeout_ms,
        heartbeat_interval_ms=s.heartbeat_interval_ms,
        max_poll_interval_ms=s.max_poll_interval_ms,
        rebalance_timeout_ms=s.max_poll_interval_ms,
    )
