"""Lag and flow sampling: what the telemetry is handed every ``--lag-interval-s``.

Per assigned partition: its lag (log end offset - committed offset; the member's own commit, else
the group's, else the log start with ``--auto-offset-reset earliest``) and the timestamp of its
oldest unwritten record (records not yet read are newer: the consumer reads a partition in
order); and the records in flight and waiting in the broker.

The log end offset is the broker's ListOffsets answer, raised to the fetch high watermark and to
the last offset read + 1: the embedded Tansu answers ListOffsets with the last batch's base
offset + 1, not the last record's offset + 1.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from spinf_stream.stream.inflight import Inflight
from spinf_stream.stream.stats import ServiceStats
from spinf_stream.telemetry import PartitionSample, Sample, StreamTelemetry

log = logging.getLogger("spinf_stream.stream.service")  # the service's log, whichever part writes it


def more_in_broker(consumer: AIOKafkaConsumer, inflight: Inflight) -> bool:
    """Whether a partition that is read (assigned, not paused) has records in the broker beyond
    the last one read: its high watermark from the latest fetch is above that offset + 1."""
    live = consumer.assignment() - consumer.paused()
    for tp, part in inflight.parts.items():
        last = part.offsets.last_tracked
        if tp in live and not part.revoked and last is not None:
            high = consumer.highwater(tp)
            if high is not None and high > last + 1:
                return True
    return False


class LagSampler:
    """Samples ``inflight``'s partitions through ``consumer`` for ``telemetry``."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        inflight: Inflight,
        stats: ServiceStats,
        telemetry: StreamTelemetry,
        auto_offset_reset: str,
        queues: Callable[[], tuple[tuple[str, str, int], ...]] = tuple,
    ) -> None:
        self._queues = queues  # (pack, model, messages waiting) per lane
        self._consumer = consumer
        self._inflight = inflight
        self._stats = stats
        self._telemetry = telemetry
        self._auto_offset_reset = auto_offset_reset

    async def run(self) -> None:
        """Every ``--lag-interval-s`` until cancelled: hand the telemetry a :meth:`sample`. A failed
        sample (e.g. the broker is unreachable) is logged and skipped, never fatal."""
        while True:
            await asyncio.sleep(self._telemetry.lag_interval_s)
            try:
                self._telemetry.observe(await self.sample())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("telemetry sample failed: %s: %s", type(exc).__name__, exc)

    async def sample(self) -> Sample:
        """Lag and oldest unwritten record per assigned partition, and the flow counts."""
        consumer = self._consumer
        parts = self._inflight.parts
        assigned = sorted(consumer.assignment())
        ends = await consumer.end_offsets(assigned) if assigned else {}
        committed: dict[TopicPartition, int | None] = {}
        for tp in assigned:
            part = parts.get(tp)
            committed[tp] = self._stats.committed.get(tp) if part is not None else None
            if committed[tp] is None:
                committed[tp] = await consumer.committed(tp)
        unknown = [tp for tp, c in committed.items() if c is None]
        if unknown and self._auto_offset_reset == "earliest":
            committed.update(await consumer.beginning_offsets(unknown))
        paused = consumer.paused()
        samples = []
        for tp in assigned:
            part = parts.get(tp)
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
        st = self._stats
        return Sample(
            tuple(samples), self._inflight.unacked(), st.consumed, st.scored, st.dead_lettered, self._waiting(paused, committed),
            self._queues(),
        )

    def _waiting(self, paused: set[TopicPartition], committed: dict[TopicPartition, int | None]) -> int:
        """Records that wait to be written: in flight, plus those the latest fetch of each read
        (assigned, not paused) partition saw beyond the last record read of it (or, before the
        first, beyond its committed offset)."""
        consumer = self._consumer
        n = self._inflight.unacked()
        for tp in consumer.assignment() - paused:
            high = consumer.highwater(tp)
            part = self._inflight.parts.get(tp)
            last = part.offsets.last_tracked if part is not None else None
            start = last + 1 if last is not None else committed.get(tp)
            if high is not None and start is not None:
                n += max(0, high - start)
        return n
