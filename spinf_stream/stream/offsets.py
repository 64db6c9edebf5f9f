"""Which offsets may be committed: per partition, up to the highest *contiguous* acknowledged offset.

A record's offset is *tracked* when the consumer hands it to the scorer and *acknowledged* when the
broker has acknowledged the record written for it (a score or a dead-letter record). Kafka's
committed offset means "everything below this is done", so a partition's commit position is
``o + 1`` where ``o`` is the last offset of the longest acknowledged prefix of the tracked
offsets, in consumption order. Tracked offsets need not be consecutive integers (compacted topics
and transaction markers leave gaps); contiguity is over what was tracked.

Pure logic, no I/O: the service calls it from the event loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)


class PartitionOffsets:
    """Commit bookkeeping of one partition.

    Offsets must be tracked in increasing order (the order a consumer reads them); acknowledgements
    may come in any order. ``committable()`` is the offset to commit (``last contiguous ack + 1``),
    or ``None`` when it has not moved since :meth:`mark_committed`.
    """

    __slots__ = ("_order", "_unacked", "_acked", "_position", "_committed", "_last_tracked")

    def __init__(self) -> None:
        self._order: deque[int] = deque()  # tracked, not yet part of the acknowledged prefix
        self._unacked: set[int] = set()  # tracked, not acknowledged
        self._acked: set[int] = set()  # acknowledged offsets still in _order (behind a gap)
        self._position: int | None = None  # last offset of the acknowledged prefix, + 1
        self._committed: int | None = None  # last position handed to mark_committed
        self._last_tracked: int | None = None

    def track(self, offset: int) -> None:
        """Record that ``offset`` was consumed. Raises ``ValueError`` if not above the last tracked."""
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        if self._last_tracked is not None and offset <= self._last_tracked:
            raise ValueError(f"offset {offset} tracked after {self._last_tracked}: offsets must increase")
        self._last_tracked = offset
        self._order.append(offset)
        self._unacked.add(offset)

    def ack(self, offset: int) -> None:
        """Record that the output for ``offset`` was acknowledged by the broker.

        Raises ``ValueError`` for an offset that is not tracked or already acknowledged.
        """
        if offset not in self._unacked:
            raise ValueError(f"offset {offset} is not pending (untracked or already acknowledged)")
        self._unacked.remove(offset)
        self._acked.add(offset)
        while self._order and self._order[0] in self._acked:
            done = self._order.popleft()
            self._acked.discard(done)
            self._position = done + 1

    @property
    def position(self) -> int | None:
        """``last contiguous acknowledged offset + 1`` (``None`` before the first such ack)."""
        return self._position

    @property
    def pending(self) -> int:
        """Tracked offsets not yet in the acknowledged prefix (acknowledged ones behind a gap count)."""
        return len(self._order)

    @property
    def unacked(self) -> int:
        """Tracked offsets whose output the broker has not acknowledged yet."""
        return len(self._unacked)

    @property
    def last_tracked(self) -> int | None:
        return self._last_tracked

    def committable(self) -> int | None:
        """The offset to commit now, or ``None`` if nothing new since the last commit."""
        if self._position is None or self._position == self._committed:
            return None
        return self._position

    def mark_committed(self, position: int) -> None:
        """Record that ``position`` was committed (the broker accepted it)."""
        if self._committed is None or position > self._committed:
            self._committed = position


class OffsetTracker(Generic[P]):
    """:class:`PartitionOffsets` for many partitions, keyed by e.g. ``TopicPartition``."""

    def __init__(self) -> None:
        self._parts: dict[P, PartitionOffsets] = {}

    def partition(self, tp: P) -> PartitionOffsets:
        """The bookkeeping of ``tp`` (created on first use)."""
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = PartitionOffsets()
        return part

    def track(self, tp: P, offset: int) -> None:
        self.partition(tp).track(offset)

    def ack(self, tp: P, offset: int) -> None:
        self.partition(tp).ack(offset)

    def committable(self, only: Iterable[P] | None = None) -> dict[P, int]:
        """``{tp: offset}`` for every partition whose commit position moved (optionally only ``only``)."""
        keys = self._parts.keys() if only is None else [tp for tp in only if tp in self._parts]
        out = {}
        for tp in keys:
            pos = self._parts[tp].committable()
            if pos is not None:
                out[tp] = pos
        return out

    def mark_committed(self, offsets: dict[P, int]) -> None:
        for tp, pos in offsets.items():
            if tp in self._parts:
                self._parts[tp].mark_committed(pos)

    def forget(self, tps: Iterable[P]) -> None:
        """Drop the bookkeeping of partitions this member no longer owns."""
        for tp in tps:
            self._parts.pop(tp, None)

    @property
    def unacked(self) -> int:
        return sum(p.unacked for p in self._parts.values())

    def __contains__(self, tp: object) -> bool:
        return tp in self._parts
