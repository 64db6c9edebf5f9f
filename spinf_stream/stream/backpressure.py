"""Backpressure: which assigned partitions to pause and which to resume, from what each holds.

A partition pauses when its own records in flight (consumed, not yet acknowledged) reach its share
of ``--max-inflight``, ``max_inflight // assigned partitions``, and resumes when they fall to half
of it: a lane that is slow (its model swapped out, a long pack) holds back only the partitions
whose records wait in it, and the others keep being read. A poll asks for at most one share (and
never more than the room left), so one partition seldom fills the room of all; every partition
pauses while the total reaches ``max_inflight`` or while the service stops.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Generic, TypeVar

P = TypeVar("P")


@dataclass(frozen=True)
class Decision(Generic[P]):
    """Partitions to pause (assigned, not paused now) and to resume (paused now)."""

    pause: frozenset[P]
    resume: frozenset[P]


def share(max_inflight: int, assigned: int) -> int:
    """Records in flight at which one of ``assigned`` partitions pauses (at least 1)."""
    return max(1, max_inflight // max(1, assigned))


def decide(inflight: Mapping[P, int], assigned: Set[P], paused: Set[P], max_inflight: int, stopping: bool) -> Decision[P]:
    """What to pause and resume now.

    Args:
        inflight: records in flight per partition (a partition absent holds none).
        assigned: the partitions assigned to this member.
        paused: those paused now.
        max_inflight: ``--max-inflight``, the bound on the total.
        stopping: the service is stopping (everything pauses).
    """
    total = sum(inflight.get(tp, 0) for tp in assigned)
    if stopping or total >= max_inflight:
        return Decision(frozenset(assigned - paused), frozenset())
    limit = share(max_inflight, len(assigned))
    hold = {tp for tp in assigned if inflight.get(tp, 0) >= limit}
    release = {tp for tp in paused & assigned if inflight.get(tp, 0) <= limit // 2}
    return Decision(frozenset(hold - paused), frozenset(release))
