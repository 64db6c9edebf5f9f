"""Committing: each partition's position (highest contiguous acknowledged offset + 1), in rounds.

A partition's offset is committed only up to its highest contiguous offset whose written record
the broker acknowledged (:mod:`~spinf_stream.stream.offsets`), so that a restart rescores
everything not written yet (at-least-once). A round commits every live partition that moved;
rounds run every ``--commit-interval-ms``, or with ``0`` after each acknowledgement.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from spinf_stream.stream.inflight import Inflight, Partition
from spinf_stream.stream.stats import ServiceStats
from spinf_stream.telemetry import StreamTelemetry

log = logging.getLogger("spinf_stream.stream.service")  # the service's log, whichever part writes it


class Committer:
    """Commits the positions of ``inflight``'s partitions through ``consumer``.

    Args:
        interval_s: seconds between rounds of :meth:`run`; ``0``: a round after each
            acknowledgement (``inflight.progress``).
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        inflight: Inflight,
        stats: ServiceStats,
        telemetry: StreamTelemetry,
        interval_s: float,
    ) -> None:
        self._consumer = consumer
        self._inflight = inflight
        self._stats = stats
        self._telemetry = telemetry
        self._interval_s = interval_s

    async def run(self) -> None:
        """Commit in rounds until cancelled."""
        interval = self._interval_s
        progress = self._inflight.progress
        while True:
            if interval > 0:
                await asyncio.sleep(interval)
            else:
                progress.clear()
                await progress.wait()
            await self.commit()

    async def commit(self, parts: list[Partition] | None = None) -> None:
        """Commit ``last contiguous acknowledged offset + 1`` of each of ``parts`` (default: the
        live partitions) that moved. A failed commit is logged and left to the next round."""
        chosen = parts if parts is not None else self._inflight.live()
        offsets = {}
        for p in chosen:
            pos = p.offsets.committable()
            if pos is not None:
                offsets[p.tp] = pos
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except KafkaError as exc:
            # e.g. a rebalance is in progress: the listener commits revoked partitions itself,
            # and the next round retries the others.
            log.warning("commit failed (will retry): %s", exc)
            self._telemetry.commit_failed(exc)
            return
        self._telemetry.committed()
        for p in chosen:
            if p.tp in offsets:
                p.offsets.mark_committed(offsets[p.tp])
                self._stats.committed[p.tp] = offsets[p.tp]
        self._stats.commits += 1
