"""Writing: the record of each consumed record, built as its model, sent in order, acknowledged.

Every consumed record gets one written record per pack of its route (its *targets*, see
:mod:`~spinf_stream.stream.routing`), keyed like the input: a score on the target's output topic
(:class:`~spinf_stream.stream.records.StreamScoreRecord`) or a dead letter
(:class:`~spinf_stream.stream.records.DeadLetterRecord`, cut to fit by
:mod:`~spinf_stream.stream.dlq`) for that pack; a record no pack can read (undecodable, no route,
unknown pack) gets one dead letter instead. A partition's records go to the producer in input
order: a consumed record's records are released only when all of them are built and all earlier
ones of its partition are released; its offset counts as acknowledged when every one of them is. An unkeyed record goes to
the output partition numbered like its input partition (modulo the output's partitions), so
that one input partition's records stay in one output partition.

A score record over the size the producer and topics accept becomes a ``record_too_large`` dead
letter; a record the producer or broker still refuses for its size is reported and skipped (its
offset may be committed past); any other failure to write stops the service
(:class:`ProduceFailed`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import orjson
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError
from aiokafka.structs import RecordMetadata

from spinf_stream.config import RunSettings
from spinf_stream.engine.results import ErrorRecord, ModelRef, ScoreRecord
from spinf_stream.stream.dlq import dead_letter, output_headers, record_size
from spinf_stream.stream.inflight import Inflight, Outgoing, Partition, Record, Slot
from spinf_stream.stream.records import Source, StreamScoreRecord
from spinf_stream.stream.stats import ServiceStats
from spinf_stream.telemetry import StreamTelemetry

if TYPE_CHECKING:
    from spinf_stream.telemetry.recorder import BatchTrace

log = logging.getLogger("spinf_stream.stream.service")  # the service's log, whichever part writes it

#: Errors by which the producer or the broker refuses a record for its size.
SIZE_ERRORS = (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError)


class ProduceFailed(RuntimeError):
    """The producer could not write a record (after its retries); the service stops."""


async def record_limit(settings: RunSettings, topics: Sequence[str] | None = None) -> int:
    """``--max-request-size``, lowered to the ``max.message.bytes`` of the output and dead-letter
    topics (``topics``; default ``--output-topic`` and ``--dlq-topic``) where the broker tells it
    (a broker that does not answer leaves the producer's limit)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    limit = settings.max_request_size
    admin = AIOKafkaAdminClient(**settings.client_kwargs())
    try:
        await asyncio.wait_for(admin.start(), 5)
        topics = sorted(set(topics) if topics is not None else {settings.output_topic, settings.dlq_topic})
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


def source_of(rec: Record) -> Source:
    """Where ``rec`` was read (its timestamp ``None`` when the record has none)."""
    ts = rec.timestamp if rec.timestamp is not None and rec.timestamp >= 0 else None
    return Source(topic=rec.topic, partition=rec.partition, offset=rec.offset, timestamp=ts)


class Writer:
    """Builds the records written for each slot, sends each partition's records in offset order,
    and counts their acknowledgements into the partitions' offsets.

    Args:
        settings: the dead-letter topic, ``--max-request-size``.
        models: the ``model`` block of a lane's scorer, by lane key (dead letters name it).
        telemetry, stats: where acknowledgements, skips and counts go.
        inflight: the partitions; ``inflight.progress`` is set on each acknowledgement or skip.
        fail: called with a :class:`ProduceFailed` when a record cannot be written.
    """

    def __init__(
        self,
        settings: RunSettings,
        models: Callable[[str], ModelRef | None],
        telemetry: StreamTelemetry,
        stats: ServiceStats,
        inflight: Inflight,
        fail: Callable[[BaseException], None],
    ) -> None:
        self._dlq_topic = settings.dlq_topic
        self._models = models
        self._telemetry = telemetry
        self._stats = stats
        self._inflight = inflight
        self._fail = fail
        #: the largest record written (bytes): the producer's max.request.size, lowered at start to
        #: the output and dead-letter topics' max.message.bytes where the broker says
        self.max_record_bytes = settings.max_request_size
        self._queue: asyncio.Queue[tuple[Slot, Outgoing]] = asyncio.Queue()
        self._out_partitions: dict[str, list[int]] = {}

    # -- build --------------------------------------------------------------------------------

    def score(self, slot: Slot, index: int, record: ScoreRecord, batch: BatchTrace | None = None) -> None:
        """Build the score record of ``slot``'s target ``index`` (a ``record_too_large`` dead
        letter if it does not fit)."""
        rec = slot.record
        target = slot.targets[index]
        written = StreamScoreRecord.model_validate(
            {**dict(record), "source": source_of(rec), "truncated": slot.truncated.get(index)})
        topic = target.output_topic
        headers = output_headers(rec.headers, pack_name=record.pack.name, pack_version=record.pack.version, model=record.model)
        value = orjson.dumps(written.model_dump(mode="json"))
        size = record_size(rec.key, value, headers)
        if size > self.max_record_bytes:
            self.dead_letter(slot, "record_too_large", (
                f"the score record would be {size} bytes; the producer and topic accept {self.max_record_bytes}"),
                index=index, batch=batch)
            return
        headers, span = self._telemetry.outgoing_headers(headers, rec.headers, topic, batch)
        slot.outs[index] = Outgoing(topic=topic, value=value, key=rec.key, headers=headers, batch=batch, span=span,
                                    pack=record.pack.name, model=record.model.name)
        self._stats.scored += 1

    def dead_letter(
        self,
        slot: Slot,
        kind: str,
        message: str,
        *,
        index: int | None = None,
        message_id: str | None = None,
        policy: Literal["truncate", "reject"] | None = None,
        batch: BatchTrace | None = None,
    ) -> None:
        """Build the dead letter of ``kind`` for ``slot``'s target ``index``, or (``None``) the one
        dead letter of a record no pack can read, replacing all its targets (cut to fit the size
        limit). A dead letter names its pack and model: the target's, or the record's only one."""
        rec = slot.record
        topic = self._dlq_topic
        target = slot.targets[index] if index is not None else (slot.targets[0] if len(slot.targets) == 1 else None)
        pack = (target.pack_name, target.pack_version) if target is not None else None
        model = self._models(target.lane) if target is not None else None
        headers = output_headers(
            rec.headers, pack_name=pack[0] if pack else None, pack_version=pack[1] if pack else None, model=model,
            error_kind=kind,
        )
        headers, span = self._telemetry.outgoing_headers(headers, rec.headers, topic, batch)
        letter = dead_letter(
            kind=kind,
            message=message,
            source=source_of(rec),
            value=rec.value,
            key=rec.key,
            headers=rec.headers,
            message_id=message_id,
            policy=policy,
            pack=pack,
            model=model,
            max_bytes=self.max_record_bytes,
            out_headers=headers,
        )
        if letter.record.cut:
            log.info("dead letter %s[%d]@%d cut to fit %d bytes: %s", rec.topic, rec.partition, rec.offset,
                     self.max_record_bytes, ", ".join(f"{c.part} {c.kept} of {c.size}" for c in letter.record.cut))
        out = Outgoing(topic=topic, value=letter.value, key=letter.key, headers=headers, error_type=kind, batch=batch,
                       span=span, pack=pack[0] if pack else None, model=model.name if model else None)
        if index is None:
            slot.outs = [out]
        else:
            slot.outs[index] = out
        self._stats.dead_lettered += 1
        log.debug("dead letter %s[%d]@%d: %s", rec.topic, rec.partition, rec.offset, kind)

    def batch_done(
        self, entries: Sequence[tuple[Slot, int]], records: Sequence[ScoreRecord | ErrorRecord], trace: BatchTrace
    ) -> None:
        """Build the record of each ``(slot, target index)`` of an engine batch (``records``: the
        engine's, in the same order; a slot of a revoked partition is skipped) and release the
        slots that are built, in order."""
        touched: dict[TopicPartition, Partition] = {}
        for (slot, index), rec in zip(entries, records):
            if slot.part.revoked:
                continue
            if isinstance(rec, ErrorRecord):
                self.dead_letter(slot, rec.error.kind, rec.error.message, index=index, message_id=slot.message_id,
                                 batch=trace)
            else:
                self.score(slot, index, rec, trace)
            touched[slot.part.tp] = slot.part
        for part in touched.values():
            self.release(part)

    def release(self, part: Partition) -> None:
        """Hand the partition's built records to the producer, in offset order, up to the first
        consumed record whose records are not all built."""
        q = part.queue
        while q and q[0].built:
            slot = q.popleft()
            slot.owed = len(slot.outs)
            for out in slot.outs:
                assert out is not None
                self._queue.put_nowait((slot, out))

    # -- send ---------------------------------------------------------------------------------

    async def run(self, producer: AIOKafkaProducer) -> None:
        """Send released records with ``producer`` until cancelled (records of revoked partitions
        are dropped)."""
        while True:
            slot, out = await self._queue.get()
            if slot.part.revoked:
                continue
            partition = None
            if out.key is None:  # keep unkeyed records of one input partition in one output partition
                partition = await self._unkeyed_partition(producer, out.topic, slot.record.partition)
            try:
                fut = await producer.send(out.topic, out.value, key=out.key, headers=out.headers, partition=partition)
            except SIZE_ERRORS as exc:  # the producer's own size check
                self._skip(slot, out, exc)
                continue
            fut.add_done_callback(lambda f, slot=slot, out=out: self._on_ack(slot, out, f))

    async def _unkeyed_partition(self, producer: AIOKafkaProducer, topic: str, source_partition: int) -> int:
        parts = self._out_partitions.get(topic)
        if parts is None:
            found = await producer.partitions_for(topic)
            parts = self._out_partitions[topic] = sorted(found)
        return parts[source_partition % len(parts)]

    def _on_ack(self, slot: Slot, out: Outgoing, fut: asyncio.Future[RecordMetadata]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if isinstance(exc, SIZE_ERRORS):  # the broker's size check
            self._skip(slot, out, exc)
            return
        if exc is not None:
            rec = slot.record
            self._fail(ProduceFailed(
                f"writing the record for {rec.topic}[{rec.partition}]@{rec.offset} to {out.topic} failed: {exc!r}"))
            return
        self._stats.acked += 1
        self._stats.last_acked_at = time.monotonic()
        rec = slot.record
        self._telemetry.acked(rec.topic, rec.partition, rec.timestamp, slot.read_at, out.error_type, out.span, out.batch,
                              pack=out.pack, model=out.model)
        self._done(slot)

    def _done(self, slot: Slot) -> None:
        """One of ``slot``'s written records is acknowledged (or skipped): its offset counts once
        all are."""
        slot.owed -= 1
        if slot.owed == 0 and not slot.part.revoked:
            slot.part.offsets.ack(slot.record.offset)
        self._inflight.progress.set()

    def _skip(self, slot: Slot, out: Outgoing, exc: BaseException) -> None:
        """The record ``out`` written for ``slot`` was refused for its size: report it, count it,
        and treat it as done (the input's offset may be committed past)."""
        rec = slot.record
        self._telemetry.skipped(rec.topic, rec.partition, rec.offset, out.topic, exc)
        self._stats.skipped += 1
        if out.span is not None:
            out.span.end()
        self._done(slot)
