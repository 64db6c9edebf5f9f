"""Rebalances: settle the revoked partitions before they move, take note of the assigned ones.

Before revoked partitions move to another member, their in-flight work is finished (up to the
settle timeout) or dropped, and what was acknowledged is committed; the next owner rescores
what was dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka import ConsumerRebalanceListener, TopicPartition

from spinf_stream.stream.committer import Committer
from spinf_stream.stream.scheduler import Scheduler
from spinf_stream.stream.inflight import Entry, Inflight
from spinf_stream.stream.stats import ServiceStats
from spinf_stream.telemetry import StreamTelemetry

log = logging.getLogger("spinf_stream.stream.service")  # the service's log, whichever part writes it


class Rebalance(ConsumerRebalanceListener):
    """The consumer's rebalance listener.

    Args:
        batcher: the open batches; entries of revoked partitions are discarded.
        settle_timeout_s: how long to wait for in-flight work of revoked partitions to be written.
        failed: whether the service has failed (no point waiting then).
        revoking: called when partitions are about to be revoked, before the wait.
        assigned: set on the first assignment of any partition.
    """

    def __init__(
        self,
        inflight: Inflight,
        committer: Committer,
        batcher: Scheduler[Entry],
        stats: ServiceStats,
        telemetry: StreamTelemetry,
        *,
        settle_timeout_s: float,
        failed: Callable[[], bool],
        revoking: Callable[[], None],
        assigned: asyncio.Event,
    ) -> None:
        self._inflight = inflight
        self._committer = committer
        self._batcher = batcher
        self._stats = stats
        self._telemetry = telemetry
        self._settle_timeout_s = settle_timeout_s
        self._failed = failed
        self._revoking = revoking
        self._assigned = assigned

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.settle(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.take(set(assigned))

    def take(self, assigned: set[TopicPartition]) -> None:
        """Record the new assignment (stats, telemetry, log)."""
        self._stats.assignment = set(assigned)
        self._telemetry.assigned(len(assigned))
        log.info("assigned partitions: %s", _fmt(assigned))
        if assigned:
            self._assigned.set()

    async def settle(self, revoked: set[TopicPartition]) -> None:
        """Before ``revoked`` move to another member: finish their in-flight work (up to the
        settle timeout), drop the rest, and commit what was acknowledged."""
        if not revoked:
            return  # the first join revokes nothing
        self._stats.rebalances += 1
        self._telemetry.rebalanced()
        self._revoking()
        flight = self._inflight
        parts = [flight.parts[tp] for tp in revoked if tp in flight.parts]
        log.info("revoking partitions: %s", _fmt(revoked))
        deadline = time.monotonic() + self._settle_timeout_s
        while not self._failed() and any(p.offsets.unacked for p in parts):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            flight.progress.clear()
            try:
                await asyncio.wait_for(flight.progress.wait(), timeout=min(left, 0.5))
            except TimeoutError:
                pass
        await self._committer.commit(parts)
        dropped = flight.revoke(parts)
        self._batcher.discard(lambda entry: entry[0].part.revoked)
        if dropped:
            log.info("dropped %d in-flight records of revoked partitions (the next owner rescores them)", dropped)


def _fmt(tps: set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps)) or "none"
