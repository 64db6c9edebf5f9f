"""The scoring service: consume → decode → prepare → micro-batch → engine → produce → commit.

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

Threads, sized to the machine (README, "The service"): the event loop (consume, decode, build
records, produce, commit) on the main thread; tokenization on one thread (about 0.6 ms per
message, a fraction of a per cent of the engine's time on the CPU); the engine on one thread
(:class:`~spinf_stream.stream.engine_thread.EngineThread`, shared with the model load so that
OpenMP keeps one team of workers), whose torch compute threads take every usable CPU
(:func:`spinf_stream.device.size_cpu_threads`). The other threads wake rarely and briefly, so
they are not given a CPU of their own.

Keeping the engine busy: with a backlog, a batch fills the token budget (the latency window holds
for input that trickles in, not for records already read or waiting in the broker; see
:mod:`~spinf_stream.stream.batcher`), and when a batch finishes the next one goes to the engine
before the finished one's records are built, written and acknowledged.

Delivery (at-least-once):

- every consumed record gets exactly one written record: a score on the output topic or a
  dead-letter record; they are written in input order per partition (a per-partition queue releases
  a record only when all earlier ones of its partition are released), keyed like the input;
- a partition's offset is committed only up to its highest contiguous offset whose written record
  the broker acknowledged (:mod:`spinf_stream.stream.offsets`);
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
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError

from spinf_stream.config import RunSettings
from spinf_stream.messages import text_field
from spinf_stream.stream.batcher import Batcher
from spinf_stream.stream.codec import Decoded, Rejection, check_pack_header, decode_value
from spinf_stream.stream import fetch_guard
from spinf_stream.stream.dlq import dead_letter, output_headers, record_size
from spinf_stream.stream.engine_thread import EngineThread
from spinf_stream.stream.fetch_guard import UndecodableRecord
from spinf_stream.stream.offsets import PartitionOffsets
from spinf_stream.stream.records import Source
from spinf_stream.stream.scorer import (
    MessageFactory,
    Prepared,
    Scorer,
    engine_message_factory,
    is_error,
    prepare_messages,
    questions_answered,
    run_measured,
    scorer_info,
)
from spinf_stream.telemetry import PartitionSample, Sample, StreamTelemetry

log = logging.getLogger(__name__)

POLL_TIMEOUT_MS = 100
#: After :meth:`ScoringService.abort`: the longest wait for the producer's flush, and for the
#: final commit, each (s).
ABORT_WAIT_S = 5.0
#: Errors by which the producer or the broker refuses a record for its size.
SIZE_ERRORS = (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError)
# Messages tokenized per call to Engine.prepare: a full batch can start before a large fetch is
# all tokenized (the batcher holds a partial one while the rest is tokenized).
PREPARE_CHUNK = 128


class ProduceFailed(RuntimeError):
    """The producer could not write a record (after its retries); the service stops."""


@dataclass(eq=False, slots=True)
class _Outgoing:
    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    error_type: str | None = None  # the dead-letter kind; None for a score


@dataclass(eq=False, slots=True)
class _Slot:
    """One consumed record on its way through the service."""

    record: Any  # aiokafka ConsumerRecord
    part: _Partition
    read_at: float = 0.0  # time.monotonic() when consumed
    message_id: str | None = None
    truncated: Any = None
    out: _Outgoing | None = None
    batch: Any = None  # telemetry's BatchTrace of the engine batch it was in
    span: Any = None  # telemetry's span of the written record (tracing only)


@dataclass(eq=False)
class _Partition:
    """What this member holds for one assigned partition (replaced if it is assigned again)."""

    tp: TopicPartition
    offsets: PartitionOffsets = field(default_factory=PartitionOffsets)
    queue: deque[_Slot] = field(default_factory=deque)  # consumed, not yet released for writing
    revoked: bool = False
    # (offset, timestamp ms) of consumed records, oldest first; trimmed when sampled (time lag)
    stamps: deque[tuple[int, int]] = field(default_factory=deque)


@dataclass(eq=False, slots=True)
class _Running:
    """A batch in the engine: its records' slots and items, packed tokens, telemetry trace, and the
    future of ``run_measured``."""

    live: list[tuple[_Slot, Any]]
    tokens: int
    trace: Any
    future: asyncio.Future[Any]


@dataclass
class ServiceStats:
    """Counters for logs, tests and benchmarks (no content)."""

    consumed: int = 0
    scored: int = 0
    dead_lettered: int = 0
    acked: int = 0
    batches: int = 0
    batch_messages: int = 0
    batch_tokens: int = 0  # packed tokens of every batch (fill = batch_tokens / batches / budget)
    engine_seconds: float = 0.0  # time the engine spent on batches (wall, from run_measured)
    commits: int = 0
    rebalances: int = 0
    dropped_on_revoke: int = 0
    skipped: int = 0  # records the broker refused for their size (reported, not written)
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    assignment: set[TopicPartition] = field(default_factory=set)
    first_consumed_at: float | None = None  # time.monotonic() of the first consumed record
    last_acked_at: float | None = None  # time.monotonic() of the latest acknowledgement


class _Listener(ConsumerRebalanceListener):
    def __init__(self, service: ScoringService) -> None:
        self._service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._service._settle(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._service._on_assigned(set(assigned))


class ScoringService:
    """Scores the input topics of ``settings`` with ``scorer`` until :meth:`stop` (or a failure).

    Args:
        settings: topics, group, batching and Kafka client settings.
        scorer: the engine (see :class:`spinf_stream.stream.scorer.Scorer`).
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
        scorer: Scorer,
        *,
        make_message: MessageFactory | None = None,
        settle_timeout_s: float | None = None,
        telemetry: StreamTelemetry | None = None,
        engine_thread: EngineThread | None = None,
    ) -> None:
        self.settings = settings
        self.scorer = scorer
        self.telemetry = telemetry if telemetry is not None else StreamTelemetry.off()
        self.telemetry.scorer_ready(scorer_info(scorer))
        self._make_message = make_message
        self.stats = ServiceStats()
        self._settle_timeout_s = (
            settle_timeout_s if settle_timeout_s is not None else min(30.0, settings.max_poll_interval_ms / 4000)
        )
        self._pack = (str(scorer.pack.name), str(scorer.pack.version))
        self._model = scorer.model_info
        # --input-format text: each value is the text of the pack's one field (checked here too)
        self._text_field = (
            text_field(tuple(scorer.pack.fields), self._pack[0]) if settings.input_format == "text" else "text"
        )
        self._parts: dict[TopicPartition, _Partition] = {}
        self._batcher: Batcher[tuple[_Slot, Any]] = Batcher(
            settings.token_budget, settings.max_batch_messages, settings.window_ms / 1000
        )
        self._send_queue: asyncio.Queue[_Slot] = asyncio.Queue()
        self._progress = asyncio.Event()  # set whenever a record is acknowledged or fails
        self._stop_requested = asyncio.Event()
        self._fatal: BaseException | None = None
        self._aborting = False
        self._paused = False
        self._ingesting = 0
        self._preparing = 0  # records read and decoded, not yet tokenized
        self._broker_backlog = False  # the latest poll left records in the broker (not paused)
        self._out_partitions: dict[str, list[int]] = {}
        self.assigned = asyncio.Event()  # set on the first assignment (tests, dev)
        self.drained = False  # after run(): everything consumed was written before the stop
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._owns_engine_thread = engine_thread is None
        self._engine_thread = engine_thread if engine_thread is not None else EngineThread()
        # One thread: tokenizing is ~0.6 ms per message (smollm2, sms_spam), far ahead of the engine.
        self._prepare_pool = ThreadPoolExecutor(1, thread_name_prefix="spinf-prepare")
        self._prepare_queue: asyncio.Queue[tuple[_Slot, tuple[str, dict[str, Any]]]] = asyncio.Queue()
        # the largest record written: the producer's max.request.size, lowered at start to the
        # output and dead-letter topics' max.message.bytes where the broker says
        self._max_record_bytes = settings.max_request_size
        fetch_guard.install()

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
        while self.stats.acked < n:
            if self._fatal is not None:
                raise self._fatal
            self._progress.clear()
            await self._progress.wait()

    async def run(self) -> None:
        """Run until :meth:`stop` has drained everything, or raise on a failure."""
        s = self.settings
        if self._make_message is None:
            self._make_message = engine_message_factory()
        kafka = s.client_kwargs()
        self._producer = AIOKafkaProducer(
            **kafka,
            acks="all",
            enable_idempotence=s.enable_idempotence,
            linger_ms=5,
            max_request_size=s.max_request_size,
        )
        self._consumer = AIOKafkaConsumer(
            **kafka,
            group_id=s.group_id,
            enable_auto_commit=False,
            auto_offset_reset=s.auto_offset_reset,
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            max_poll_interval_ms=s.max_poll_interval_ms,
            rebalance_timeout_ms=s.max_poll_interval_ms,
        )
        await self._producer.start()
        self._max_record_bytes = await self._record_limit()
        tasks: list[asyncio.Task[None]] = []
        graceful = False
        try:
            self._consumer.subscribe(s.input_topic, listener=_Listener(self))
            await self._consumer.start()
            self.telemetry.health.consumer_started()
            log.info(
                "scoring %s -> %s (dead letters: %s) as group %s with pack %s@%s, model %s on %s (%s)",
                ",".join(s.input_topic), s.output_topic, s.dlq_topic, s.group_id, *self._pack, self._model.name,
                self._model.device, self._model.dtype,
            )
            tasks = [
                asyncio.create_task(self._guard(self._prepare_loop()), name="spinf-prepare"),
                asyncio.create_task(self._guard(self._engine_loop()), name="spinf-engine"),
                asyncio.create_task(self._guard(self._send_loop()), name="spinf-send"),
                asyncio.create_task(self._guard(self._commit_loop()), name="spinf-commit"),
                asyncio.create_task(self._telemetry_loop(), name="spinf-telemetry"),
            ]
            graceful = self.drained = await self._poll_loop()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._close(graceful)
        if self._fatal is not None:
            raise self._fatal

    async def _record_limit(self) -> int:
        """``--max-request-size``, lowered to the output and dead-letter topics' ``max.message.bytes``
        where the broker tells it (a broker that does not answer leaves the producer's limit)."""
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        limit = self.settings.max_request_size
        admin = AIOKafkaAdminClient(**self.settings.client_kwargs())
        try:
            await asyncio.wait_for(admin.start(), 5)
            topics = sorted({self.settings.output_topic, self.settings.dlq_topic})
            answers = await asyncio.wait_for(
                admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t, {"max.message.bytes": None}) for t in topics]),
                5,
            )
            for answer in answers:
                for resource in getattr(answer, "resources", ()):
                    for entry in resource[4] if len(resource) > 4 else ():
                        if entry[0] == "max.message.bytes" and str(entry[1]).isdigit():
                            limit = min(limit, int(entry[1]))
        except Exception as exc:  # an optional refinement: the producer's limit stands
            log.debug("topic max.message.bytes not known (%s: %s)", type(exc).__name__, exc)
        finally:
            try:
                await admin.close()
            except Exception:
                pass
        return limit

    async def _close(self, graceful: bool) -> None:
        wait = ABORT_WAIT_S if self._aborting else None
        try:
            if self._fatal is None and self._producer is not None:
                await asyncio.wait_for(self._producer.flush(), wait)
            await asyncio.wait_for(self._commit(), wait)
        except Exception as exc:  # closing must go on: log and keep closing
            log.warning("final commit failed: %s", exc)
        finally:
            if self._consumer is not None:
                await self._consumer.stop()
            if self._producer is not None:
                await self._producer.stop()
            if self._owns_engine_thread:
                self._engine_thread.close()
            self._prepare_pool.shutdown(wait=False, cancel_futures=True)
        log.info(
            "stopped%s: consumed %d, scored %d, dead-lettered %d, committed %s",
            "" if graceful else " (not drained)",
            self.stats.consumed, self.stats.scored, self.stats.dead_lettered,
            {f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(self.stats.committed.items())},
        )

    async def _guard(self, coro: Any) -> None:
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
        self._progress.set()

    def _unacked(self) -> int:
        return sum(p.offsets.unacked for p in self._parts.values())

    # -- consume ------------------------------------------------------------------------------

    async def _poll_loop(self) -> bool:
        """Poll until stopped; True when everything consumed was written (drained)."""
        s = self.settings
        consumer = self._consumer
        assert consumer is not None
        deadline: float | None = None
        health = self.telemetry.health
        while True:
            health.beat()
            if self._fatal is not None:
                return False
            if self._stop_requested.is_set():
                if deadline is None:
                    deadline = time.monotonic() + s.shutdown_timeout_s
                    self._batcher.drain()
                if self._unacked() == 0 and self._ingesting == 0:
                    return True
                if time.monotonic() > deadline:
                    log.warning("shutdown timeout: %d records not written; their offsets stay uncommitted", self._unacked())
                    return False
            self._backpressure()
            room = s.max_inflight - self._unacked()
            # Poll even when every partition is paused: that keeps this member in its group.
            data = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=max(1, room))
            # A poll that returns nothing ends any claim of records waiting in the broker (the high
            # watermark overstates it on compacted or transactional topics).
            self._broker_backlog = bool(data) and self._more_in_broker()
            self._update_backlog()
            if data:
                self._ingesting += 1
                try:
                    await self._ingest(data)
                finally:
                    self._ingesting -= 1

    def _more_in_broker(self) -> bool:
        """Whether a partition that is read (assigned, not paused) has records in the broker beyond
        the last one read: its high watermark from the latest fetch is above that offset + 1."""
        consumer = self._consumer
        assert consumer is not None
        live = consumer.assignment() - consumer.paused()
        for tp, part in self._parts.items():
            last = part.offsets.last_tracked
            if tp in live and not part.revoked and last is not None:
                high = consumer.highwater(tp)
                if high is not None and high > last + 1:
                    return True
        return False

    def _update_backlog(self) -> None:
        """Tell the batcher whether input is already there: records being tokenized, or waiting
        in the broker. While it is, a partial batch is held past its window."""
        self._batcher.set_backlog(self._preparing > 0 or self._broker_backlog)

    def _backpressure(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        unacked = self._unacked()
        hold = self._stop_requested.is_set() or unacked >= self.settings.max_inflight
        if hold:
            assigned = consumer.assignment()
            if assigned - consumer.paused():
                consumer.pause(*assigned)
                if not self._paused and not self._stop_requested.is_set():
                    log.debug("backpressure: %d in flight, partitions paused", unacked)
                self._paused = True
        elif self._paused and unacked <= self.settings.max_inflight // 2:
            consumer.resume(*consumer.paused())
            self._paused = False

    async def _ingest(self, data: dict[TopicPartition, list[Any]]) -> None:
        """Track, decode and queue the records of one poll for tokenization; dead-letter those
        that are no message. Never waits on tokenization (the prepare loop does it)."""
        s = self.settings
        now = time.monotonic()
        queued = 0
        for tp, records in data.items():
            part = self._parts.get(tp)
            if part is None or part.revoked:
                part = self._parts[tp] = _Partition(tp)
            fresh = 0
            for rec in records:
                last = part.offsets.last_tracked
                if last is not None and rec.offset <= last:
                    continue  # already in flight (re-delivery after a seek)
                part.offsets.track(rec.offset)
                if rec.timestamp is not None and rec.timestamp >= 0:
                    part.stamps.append((rec.offset, rec.timestamp))
                slot = _Slot(rec, part, now)
                part.queue.append(slot)
                fresh += 1
                self.stats.consumed += 1
                if self.stats.first_consumed_at is None:
                    self.stats.first_consumed_at = time.monotonic()
                if isinstance(rec, UndecodableRecord):
                    self._dead_letter(slot, "undecodable_record", f"the Kafka client cannot parse this record: {rec.reason}")
                    continue
                decoded = decode_value(
                    rec.value, topic=rec.topic, partition=rec.partition, offset=rec.offset,
                    input_format=s.input_format, text_field=self._text_field, max_bytes=s.max_message_bytes,
                )
                wrong_pack = check_pack_header(rec.headers, pack_name=self._pack[0], pack_version=self._pack[1])
                if wrong_pack is not None:
                    given = decoded.id if isinstance(decoded, Decoded) and decoded.id_given else None
                    self._dead_letter(slot, wrong_pack.kind, wrong_pack.message, message_id=given)
                elif isinstance(decoded, Rejection):
                    policy = s.too_long if decoded.kind == "too_long" else None
                    self._dead_letter(slot, decoded.kind, decoded.message, message_id=decoded.id, policy=policy)
                else:
                    slot.message_id = decoded.id
                    self._prepare_queue.put_nowait((slot, (decoded.id, decoded.fields)))
                    queued += 1
            self.telemetry.consumed(tp.topic, tp.partition, fresh)
        for tp in data:  # dead letters at the head of a partition can go now
            part = self._parts.get(tp)
            if part is not None:
                self._release(part)
        if queued:
            # until the prepare loop has tokenized them, the batcher holds a partial batch (backlog)
            self._preparing += queued
            self._update_backlog()

    async def _prepare_loop(self) -> None:
        """Tokenize queued messages on the prepare thread, in chunks so that the engine can start
        on the first full batch while the rest is tokenized; dead-letter those the engine rejects."""
        s = self.settings
        loop = asyncio.get_running_loop()
        q = self._prepare_queue
        while True:
            chunk = [await q.get()]
            while len(chunk) < PREPARE_CHUNK and not q.empty():
                chunk.append(q.get_nowait())
            try:
                live = [(slot, m) for slot, m in chunk if not slot.part.revoked]
                prepared: list[Prepared] = []
                if live:
                    prepared = await loop.run_in_executor(
                        self._prepare_pool, prepare_messages, self.scorer, self._make_message,
                        [m for _, m in live], s.too_long, s.max_prepare_s,
                    )
                touched: dict[TopicPartition, _Partition] = {}
                for (slot, _), p in zip(live, prepared):
                    if slot.part.revoked:
                        continue
                    slot.truncated = p.truncated
                    if is_error(p.item):
                        kind = p.item.error.kind
                        if kind == "too_slow":
                            log.warning("%s[%d]@%d: %s", slot.record.topic, slot.record.partition, slot.record.offset,
                                        p.item.error.message)
                        policy = s.too_long if kind == "too_long" else None
                        self._dead_letter(slot, kind, p.item.error.message, message_id=slot.message_id, policy=policy)
                        touched[slot.part.tp] = slot.part
                    else:
                        self._batcher.add((slot, p.item), int(p.item.n_tokens))
                for part in touched.values():
                    self._release(part)
            finally:
                self._preparing -= len(chunk)
                self._update_backlog()

    # -- engine -------------------------------------------------------------------------------

    async def _engine_loop(self) -> None:
        """Keep the engine busy: when a batch finishes, the next one (if ready) goes to the engine
        thread before the finished batch's records are built and handed to the writer."""
        running: _Running | None = None
        while True:
            if running is None:
                running = self._start_batch(await self._batcher.next_batch())
                continue
            records, seconds, work = await running.future
            done = running
            self.stats.engine_seconds += seconds
            self.telemetry.batch_finished(
                done.trace, seconds, questions_answered(records), work, done.tokens,
                written=sum(not slot.part.revoked for slot, _ in done.live),
            )
            ready = self._batcher.take()
            running = self._start_batch(ready) if ready is not None else None
            self._finish_batch(done, records)

    def _start_batch(self, batch: list[tuple[_Slot, Any]]) -> _Running | None:
        """Hand ``batch`` (less the records of revoked partitions) to the engine thread."""
        live = [(slot, item) for slot, item in batch if not slot.part.revoked]
        if not live:
            return None
        tokens = sum(int(item.n_tokens) for _, item in live)
        self.stats.batches += 1
        self.stats.batch_messages += len(live)
        self.stats.batch_tokens += tokens
        started = time.monotonic()
        trace = self.telemetry.batch_started(
            [slot.record.headers for slot, _ in live], [started - slot.read_at for slot, _ in live], tokens
        )
        future = self._engine_thread.run(run_measured, self.scorer, [item for _, item in live])
        return _Running(live, tokens, trace, future)

    def _finish_batch(self, done: _Running, records: list[Any]) -> None:
        """Build the written record of each of ``done``'s messages and release them in order."""
        touched: dict[TopicPartition, _Partition] = {}
        for (slot, _), rec in zip(done.live, records):
            if slot.part.revoked:
                continue
            slot.batch = done.trace
            if is_error(rec):
                self._dead_letter(slot, rec.error.kind, rec.error.message, message_id=slot.message_id, release=False)
            else:
                self._score(slot, rec)
            touched[slot.part.tp] = slot.part
        for part in touched.values():
            self._release(part)

    # -- write --------------------------------------------------------------------------------

    def _source(self, rec: Any) -> Source:
        ts = rec.timestamp if rec.timestamp is not None and rec.timestamp >= 0 else None
        return Source(topic=rec.topic, partition=rec.partition, offset=rec.offset, timestamp=ts)

    def _score(self, slot: _Slot, record: Any) -> None:
        body = record.model_dump(mode="json") if hasattr(record, "model_dump") else dict(record)
        body["source"] = self._source(slot.record).model_dump(mode="json")
        if slot.truncated is not None:
            body["truncated"] = slot.truncated.model_dump(mode="json")
        rec = slot.record
        topic = self.settings.output_topic
        headers = output_headers(rec.headers, pack_name=self._pack[0], pack_version=self._pack[1], model=self._model)
        value = orjson.dumps(body)
        size = record_size(rec.key, value, headers)
        if size > self._max_record_bytes:
            self._dead_letter(slot, "record_too_large", (
                f"the score record would be {size} bytes; the producer and topic accept {self._max_record_bytes}"))
            return
        headers, slot.span = self.telemetry.outgoing_headers(headers, rec.headers, topic, slot.batch)
        slot.out = _Outgoing(topic=topic, value=value, key=rec.key, headers=headers)
        self.stats.scored += 1

    def _dead_letter(
        self,
        slot: _Slot,
        kind: str,
        message: str,
        *,
        message_id: str | None = None,
        policy: Any = None,
        release: bool = False,
    ) -> None:
        rec = slot.record
        topic = self.settings.dlq_topic
        headers = output_headers(
            rec.headers, pack_name=self._pack[0], pack_version=self._pack[1], model=self._model, error_kind=kind
        )
        headers, slot.span = self.telemetry.outgoing_headers(headers, rec.headers, topic, slot.batch)
        letter = dead_letter(
            kind=kind,
            message=message,
            source=self._source(rec),
            value=rec.value,
            key=rec.key,
            headers=rec.headers,
            message_id=message_id,
            policy=policy,
            pack=self._pack,
            model=self._model,
            max_bytes=self._max_record_bytes,
            out_headers=headers,
        )
        if letter.record.cut:
            log.info("dead letter %s[%d]@%d cut to fit %d bytes: %s", rec.topic, rec.partition, rec.offset,
                     self._max_record_bytes, ", ".join(f"{c.part} {c.kept} of {c.size}" for c in letter.record.cut))
        slot.out = _Outgoing(topic=topic, value=letter.value, key=letter.key, headers=headers, error_type=kind)
        self.stats.dead_lettered += 1
        log.debug("dead letter %s[%d]@%d: %s", rec.topic, rec.partition, rec.offset, kind)
        if release:
            self._release(slot.part)

    def _release(self, part: _Partition) -> None:
        """Hand the partition's finished records to the writer, in offset order."""
        q = part.queue
        while q and q[0].out is not None:
            self._send_queue.put_nowait(q.popleft())

    async def _send_loop(self) -> None:
        producer = self._producer
        assert producer is not None
        while True:
            slot = await self._send_queue.get()
            if slot.part.revoked:
                continue
            out = slot.out
            assert out is not None
            partition = None
            if out.key is None:  # keep unkeyed records of one input partition in one output partition
                partition = await self._unkeyed_partition(out.topic, slot.record.partition)
            try:
                fut = await producer.send(out.topic, out.value, key=out.key, headers=out.headers, partition=partition)
            except SIZE_ERRORS as exc:  # the producer's own size check
                self._skip(slot, exc)
                continue
            fut.add_done_callback(lambda f, slot=slot: self._on_ack(slot, f))

    async def _unkeyed_partition(self, topic: str, source_partition: int) -> int:
        parts = self._out_partitions.get(topic)
        if parts is None:
            assert self._producer is not None
            found = await self._producer.partitions_for(topic)
            parts = self._out_partitions[topic] = sorted(found)
        return parts[source_partition % len(parts)]

    def _on_ack(self, slot: _Slot, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if isinstance(exc, SIZE_ERRORS):  # the broker's size check
            self._skip(slot, exc)
            return
        if exc is not None:
            rec = slot.record
            self._fail(ProduceFailed(f"writing the record for {rec.topic}[{rec.partition}]@{rec.offset} failed: {exc!r}"))
            return
        self.stats.acked += 1
        self.stats.last_acked_at = time.monotonic()
        rec = slot.record
        self.telemetry.acked(
            rec.topic, rec.partition, rec.timestamp, slot.read_at,
            slot.out.error_type if slot.out is not None else None, slot.span, slot.batch,
        )
        if not slot.part.revoked:
            slot.part.offsets.ack(slot.record.offset)
        self._progress.set()

    def _skip(self, slot: _Slot, exc: BaseException) -> None:
        """The record written for ``slot`` was refused for its size: report it, count it, and
        treat the input record as done (its offset may be committed past)."""
        rec = slot.record
        out_topic = slot.out.topic if slot.out is not None else "?"
        self.telemetry.skipped(rec.topic, rec.partition, rec.offset, out_topic, exc)
        self.stats.skipped += 1
        if slot.span is not None:
            slot.span.end()
        if not slot.part.revoked:
            slot.part.offsets.ack(rec.offset)
        self._progress.set()

    # -- commit -------------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        interval = self.settings.commit_interval_ms / 1000
        while True:
            if interval > 0:
                await asyncio.sleep(interval)
            else:
                self._progress.clear()
                await self._progress.wait()
            await self._commit()

    async def _commit(self, parts: list[_Partition] | None = None) -> None:
        """Commit ``last contiguous acknowledged offset + 1`` of each (live) partition that moved."""
        consumer = self._consumer
        if consumer is None:
            return
        chosen = parts if parts is not None else [p for p in self._parts.values() if not p.revoked]
        offsets = {}
        for p in chosen:
            pos = p.offsets.committable()
            if pos is not None:
                offsets[p.tp] = pos
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            # e.g. a rebalance is in progress: the listener commits revoked partitions itself,
            # and the next round retries the others.
            log.warning("commit failed (will retry): %s", exc)
            self.telemetry.commit_failed(exc)
            return
        self.telemetry.committed()
        for p in chosen:
            if p.tp in offsets:
                p.offsets.mark_committed(offsets[p.tp])
                self.stats.committed[p.tp] = offsets[p.tp]
        self.stats.commits += 1

    # -- telemetry ----------------------------------------------------------------------------

    async def _telemetry_loop(self) -> None:
        """Every ``--lag-interval-s``: hand the telemetry a sample of lag and flow state. A failed
        sample (e.g. the broker is unreachable) is logged and skipped, never fatal."""
        while True:
            await asyncio.sleep(self.telemetry.lag_interval_s)
            try:
                self.telemetry.observe(await self._sample())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("telemetry sample failed: %s: %s", type(exc).__name__, exc)

    async def _sample(self) -> Sample:
        """Lag per assigned partition (log end offset - committed offset; the member's own commit,
        else the group's, else the log start with ``--auto-offset-reset earliest``) and the
        timestamp of its oldest unwritten record (records not yet read are newer: the consumer
        reads a partition in order).

        The log end offset is the broker's ListOffsets answer, raised to the fetch high watermark
        and to the last offset read + 1: the embedded Tansu answers ListOffsets with the last
        batch's base offset + 1, not the last record's offset + 1."""
        consumer = self._consumer
        assert consumer is not None
        assigned = sorted(consumer.assignment())
        ends = await consumer.end_offsets(assigned) if assigned else {}
        committed: dict[TopicPartition, int | None] = {}
        for tp in assigned:
            part = self._parts.get(tp)
            committed[tp] = self.stats.committed.get(tp) if part is not None else None
            if committed[tp] is None:
                committed[tp] = await consumer.committed(tp)
        unknown = [tp for tp, c in committed.items() if c is None]
        if unknown and self.settings.auto_offset_reset == "earliest":
            committed.update(await consumer.beginning_offsets(unknown))
        paused = consumer.paused()
        samples = []
        for tp in assigned:
            part = self._parts.get(tp)
            oldest = None
            if part is not None:
                done = part.offsets.position
                while part.stamps and done is not None and part.stamps[0][0] < done:
                    part.stamps.popleft()
                if part.offsets.unacked and part.stamps:
                    oldest = part.stamps[0][1]
            c = committed.get(tp)
            end = max(ends.get(tp, 0), consumer.highwater(tp) or 0,
                      (part.offsets.last_tracked + 1) if part is not None and part.offsets.last_tracked is not None else 0)
            lag = max(0, end - c) if c is not None else None
            samples.append(PartitionSample(tp.topic, tp.partition, lag, oldest, tp in paused))
        st = self.stats
        return Sample(tuple(samples), self._unacked(), st.consumed, st.scored, st.dead_lettered, self._waiting(paused, committed))

    def _waiting(self, paused: set[TopicPartition], committed: dict[TopicPartition, int | None]) -> int:
        """Records that wait to be written: in flight, plus those the latest fetch of each read
        (assigned, not paused) partition saw beyond the last record read of it (or, before the
        first, beyond its committed offset)."""
        consumer = self._consumer
        assert consumer is not None
        n = self._unacked()
        for tp in consumer.assignment() - paused:
            high = consumer.highwater(tp)
            part = self._parts.get(tp)
            last = part.offsets.last_tracked if part is not None else None
            start = last + 1 if last is not None else committed.get(tp)
            if high is not None and start is not None:
                n += max(0, high - start)
        return n

    # -- rebalance ----------------------------------------------------------------------------

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.stats.assignment = set(assigned)
        self.telemetry.assigned(len(assigned))
        log.info("assigned partitions: %s", _fmt(assigned))
        if assigned:
            self.assigned.set()

    async def _settle(self, revoked: set[TopicPartition]) -> None:
        """Before ``revoked`` move to another member: finish their in-flight work (up to the
        settle timeout), drop the rest, and commit what was acknowledged."""
        if not revoked:
            return  # the first join revokes nothing
        self.stats.rebalances += 1
        self.telemetry.rebalanced()
        # No poll returns while the group rebalances: a claim of records waiting in the broker
        # would hold a partial batch that the revoked partitions' work may be waiting for.
        self._broker_backlog = False
        self._update_backlog()
        parts = [self._parts[tp] for tp in revoked if tp in self._parts]
        log.info("revoking partitions: %s", _fmt(revoked))
        deadline = time.monotonic() + self._settle_timeout_s
        while self._fatal is None and any(p.offsets.unacked for p in parts):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), timeout=min(left, 0.5))
            except TimeoutError:
                pass
        await self._commit(parts)
        dropped = 0
        for p in parts:
            p.revoked = True
            dropped += p.offsets.unacked
            del self._parts[p.tp]
        self._batcher.discard(lambda entry: entry[0].part.revoked)
        if dropped:
            self.stats.dropped_on_revoke += dropped
            log.info("dropped %d in-flight records of revoked partitions (the next owner rescores them)", dropped)


def _fmt(tps: set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps)) or "none"
