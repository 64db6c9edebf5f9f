"""Which lane's batch the engine runs next: one micro-batcher per (pack, model) lane.

Each lane has its own :class:`~spinf_stream.stream.batcher.Batcher` (its token budget, the
service's latency window and message cap). When the engine asks for work, :meth:`Scheduler.pick`
chooses among the lanes with a batch ready, by this policy (*oldest first, loaded first,
capped*):

1. **Fairness cap**: a lane that has had ``fairness_cap`` batches in a row yields to any other
   lane with a batch ready, so a busy pack cannot starve a quiet one.
2. **Loaded first**: among the rest, the oldest batch (by when its first message was batched) of
   a lane whose model is loaded runs, unless a lane whose model is not loaded has had a batch
   ready for ``swap_wait_s`` or more: then, and when no loaded lane has one ready, the oldest
   ready batch of any lane runs (its model is loaded for it, evicting another if memory says so).
   Switching models costs a load; batches of the loaded model first keep swaps to about one per
   ``swap_wait_s`` when two models take turns in memory.

Ties go to the lane listed first. :meth:`Scheduler.pick` is pure and takes ``now``;
:meth:`Scheduler.next_batch` is the asyncio wrapper the service awaits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

from spinf_stream.stream.batcher import Batcher

T = TypeVar("T")

__all__ = ["Scheduler"]


class Scheduler(Generic[T]):
    """Batchers by lane, and the policy that picks the next batch (module docstring).

    Args:
        budgets: each lane's token budget, in the routes' order.
        max_messages, window_s: as :class:`~spinf_stream.stream.batcher.Batcher`'s.
        loaded: whether a lane's model is loaded now (default: always).
        fairness_cap: batches one lane may have in a row while another has one ready (>= 1).
        swap_wait_s: how long a lane whose model is not loaded waits before it may displace
            lanes whose model is (seconds).
        clock: monotonic clock in seconds (injected by tests).
    """

    def __init__(
        self,
        budgets: Mapping[str, int],
        max_messages: int,
        window_s: float,
        *,
        loaded: Callable[[str], bool] | None = None,
        fairness_cap: int = 4,
        swap_wait_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fairness_cap < 1 or swap_wait_s < 0:
            raise ValueError("fairness_cap must be >= 1 and swap_wait_s >= 0")
        self._changed = asyncio.Event()
        self._clock = clock
        self.batchers: dict[str, Batcher[T]] = {}
        for lane, budget in budgets.items():
            self.add_lane(lane, budget, max_messages, window_s)
        self._loaded = loaded or (lambda _lane: True)
        self.fairness_cap = fairness_cap
        self.swap_wait_s = swap_wait_s
        self._last: str | None = None
        self._streak = 0

    # -- pure bookkeeping ---------------------------------------------------------------------

    def add_lane(self, lane: str, budget: int, max_messages: int, window_s: float) -> None:
        """A lane more (its batcher as the others'); a lane that exists is kept as it is."""
        if lane not in self.batchers:
            self.batchers[lane] = Batcher(budget, max_messages, window_s, self._clock, changed=self._changed)

    def remove_lane(self, lane: str) -> bool:
        """Drop ``lane`` if nothing waits in it; whether it was dropped."""
        if lane in self.batchers and not len(self.batchers[lane]):
            del self.batchers[lane]
            return True
        return False

    def add(self, lane: str, item: T, n_tokens: int, now: float | None = None) -> None:
        """Queue ``item`` (costing ``n_tokens``) on ``lane``'s batcher."""
        self.batchers[lane].add(item, n_tokens, now)

    def pick(self, now: float | None = None) -> str | None:
        """The lane whose batch runs next, or ``None`` when no lane has one ready."""
        now = self._clock() if now is None else now
        ready: list[tuple[float, int, str]] = []
        for order, (lane, b) in enumerate(self.batchers.items()):
            since = b.ready_since(now)
            if since is not None:
                ready.append((since, order, lane))
        if not ready:
            return None
        if self._streak >= self.fairness_cap and any(lane != self._last for _, _, lane in ready):
            ready = [r for r in ready if r[2] != self._last]
        warm = [r for r in ready if self._loaded(r[2])]
        cold = [r for r in ready if not self._loaded(r[2])]
        if warm and not (cold and now - min(cold)[0] >= self.swap_wait_s):
            return min(warm)[2]
        return min(ready)[2]

    def take(self, now: float | None = None) -> tuple[str, list[T]] | None:
        """``(lane, batch)`` to run next by the policy, or ``None``."""
        now = self._clock() if now is None else now
        lane = self.pick(now)
        if lane is None:
            return None
        batch = self.batchers[lane].take(now)
        assert batch is not None
        self._streak = self._streak + 1 if lane == self._last else 1
        self._last = lane
        return lane, batch

    def seconds_until_ready(self, now: float | None = None) -> float | None:
        """The shortest wait until some lane has a batch ready (``None``: not before a change)."""
        waits = [w for b in self.batchers.values() if (w := b.seconds_until_ready(now)) is not None]
        return min(waits) if waits else None

    def set_backlog(self, waiting: bool) -> None:
        """See :meth:`Batcher.set_backlog` (every lane)."""
        for b in self.batchers.values():
            b.set_backlog(waiting)

    def drain(self) -> None:
        """See :meth:`Batcher.drain` (every lane)."""
        for b in self.batchers.values():
            b.drain()

    def discard(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return every waiting item of any lane for which ``predicate`` is true."""
        return [it for b in self.batchers.values() for it in b.discard(predicate)]

    def depths(self) -> dict[str, int]:
        """Items waiting, by lane."""
        return {lane: len(b) for lane, b in self.batchers.items()}

    def __len__(self) -> int:
        return sum(len(b) for b in self.batchers.values())

    @property
    def lanes(self) -> Sequence[str]:
        return list(self.batchers)

    # -- asyncio ------------------------------------------------------------------------------

    async def next_batch(self, timeout_s: float | None = None) -> tuple[str, list[T]] | None:
        """Wait for and return the next ``(lane, batch)``; ``None`` after ``timeout_s`` with none."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        while True:
            got = self.take()
            if got is not None:
                return got
            self._changed.clear()
            wait = self.seconds_until_ready()
            if deadline is not None:
                left = deadline - self._clock()
                if left <= 0:
                    return None
                wait = left if wait is None else min(wait, left)
            try:  # asyncio.timeout, not wait_for: a cancel arriving as the wait times out stays a cancel
                async with asyncio.timeout(wait):
                    await self._changed.wait()
            except TimeoutError:
                pass
