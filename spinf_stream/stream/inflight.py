"""What the member holds in flight: per assigned partition, its consumed records in input order.

A :class:`Slot` is one consumed record on its way through the service, from the poll until the
broker acknowledges every record written for it (one per pack of its route, or one dead letter);
a :class:`Partition` holds the slots of one
assigned partition in offset order, their offsets (:mod:`~spinf_stream.stream.offsets`) and
timestamps. :class:`Inflight` holds the partitions.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from spinf_stream.stream.fetch_guard import UndecodableRecord
from spinf_stream.stream.offsets import PartitionOffsets
from spinf_stream.stream.records import Truncation
from spinf_stream.stream.routing import Target

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from spinf_stream.engine.segment import PreparedMessage
    from spinf_stream.telemetry.recorder import BatchTrace

#: A consumed record: as the Kafka client parsed it, or what could be read of one it could not.
Record: TypeAlias = ConsumerRecord[bytes, bytes] | UndecodableRecord


@dataclass(eq=False, slots=True)
class Outgoing:
    """The record to write for a slot: its topic, value, Kafka key and headers."""

    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]
    error_type: str | None = None  # the dead-letter kind; None for a score
    batch: BatchTrace | None = None  # telemetry's trace of the engine batch it came from
    span: Span | None = None  # telemetry's span of the written record (tracing only)
    pack: str | None = None  # the pack and model it is for (None: a dead letter no pack read)
    model: str | None = None


@dataclass(eq=False, slots=True)
class Slot:
    """One consumed record on its way through the service.

    ``targets``: the records it owes (:class:`~spinf_stream.stream.routing.Target`, one per pack
    of its route); ``outs``: the record built for each (``None`` until built; a record-level dead
    letter replaces them all); ``owed``: written records not yet acknowledged."""

    record: Record
    part: Partition
    read_at: float = 0.0  # time.monotonic() when consumed
    message_id: str | None = None
    targets: tuple[Target, ...] = ()
    outs: list[Outgoing | None] = field(default_factory=lambda: [None])
    owed: int = 0
    truncated: dict[int, Truncation] = field(default_factory=dict)  # by target index

    @property
    def built(self) -> bool:
        """Every record it owes is built."""
        return all(o is not None for o in self.outs)

    def owe(self, targets: tuple[Target, ...]) -> None:
        """Owe one record per target."""
        self.targets = targets
        self.outs = [None] * len(targets)


@dataclass(eq=False)
class Partition:
    """What this member holds for one assigned partition (replaced if it is assigned again)."""

    tp: TopicPartition
    offsets: PartitionOffsets = field(default_factory=PartitionOffsets)
    queue: deque[Slot] = field(default_factory=deque)  # consumed, not yet released for writing
    revoked: bool = False
    # (offset, timestamp ms) of consumed records, oldest first; trimmed when sampled (time lag)
    stamps: deque[tuple[int, int]] = field(default_factory=deque)


#: A message in the batcher or the engine: its slot, the index of its target, its tokenized form.
Entry: TypeAlias = "tuple[Slot, int, PreparedMessage]"


class Inflight:
    """The partitions this member holds, and ``progress``: an event set whenever a written record
    is acknowledged (or skipped) and when the service fails."""

    def __init__(self) -> None:
        self.parts: dict[TopicPartition, Partition] = {}
        self.progress = asyncio.Event()

    def unacked(self) -> int:
        """Records consumed and not yet acknowledged, over every held partition."""
        return sum(p.offsets.unacked for p in self.parts.values())

    def live(self) -> list[Partition]:
        """The partitions not revoked."""
        return [p for p in self.parts.values() if not p.revoked]

    def take(self, tp: TopicPartition) -> Partition:
        """The partition ``tp`` (a fresh one when it is not held, or was revoked)."""
        part = self.parts.get(tp)
        if part is None or part.revoked:
            part = self.parts[tp] = Partition(tp)
        return part

    def track(self, part: Partition, rec: Record, read_at: float) -> Slot | None:
        """Queue a consumed record's slot on its partition; ``None`` when it is already in flight
        (re-delivered after a seek)."""
        last = part.offsets.last_tracked
        if last is not None and rec.offset <= last:
            return None
        part.offsets.track(rec.offset)
        if rec.timestamp is not None and rec.timestamp >= 0:
            part.stamps.append((rec.offset, rec.timestamp))
        slot = Slot(rec, part, read_at)
        part.queue.append(slot)
        return slot

    def revoke(self, parts: list[Partition]) -> int:
        """Mark ``parts`` revoked and forget them; the records they had in flight (dropped)."""
        dropped = 0
        for p in parts:
            p.revoked = True
            dropped += p.offsets.unacked
            del self.parts[p.tp]
        return dropped
