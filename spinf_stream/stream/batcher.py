"""Micro-batcher: group prepared messages into engine batches.

A batch *closes* when adding the next message would take its packed tokens past the token budget,
when its tokens reach the budget, or when it holds ``max_messages``. An open batch is *handed out*
once the latency window has passed since its first message — but only when the engine asks for
work, so while the engine is busy the open batch keeps filling (up to budget or cap), and a free
engine never waits longer than the window for input that trickles in. A message larger than the
budget gets a batch of its own (the engine spreads its branches over several passes).

The window is for input that is slow, not for a backlog that is already there: while the service
says a *backlog* is being read (:meth:`Batcher.set_backlog`: records consumed and still being
tokenized, or more records waiting in the broker), the open batch is held past its window until
it closes on the budget or the cap, or the backlog is read. A batch handed out early would cost a
forward pass more for the same messages and leave the engine below its budget.

The bookkeeping (:meth:`Batcher.add`, :meth:`Batcher.take`) is pure and takes ``now`` explicitly;
:meth:`Batcher.next_batch` is the asyncio wrapper the service awaits.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Batch(Generic[T]):
    items: list[T] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # tokens of each item
    tokens: int = 0
    opened_at: float = 0.0


class Batcher(Generic[T]):
    """Batches of items with token counts.

    Args:
        token_budget: tokens per forward pass (the engine's budget).
        max_messages: most items in a batch.
        window_s: latency window in seconds (0 = hand out as soon as asked).
        clock: monotonic clock in seconds (injected by tests).
        changed: the event set on every change (default: its own); batchers that share one are
            waited on together (:class:`~spinf_stream.stream.scheduler.Scheduler`).
    """

    def __init__(
        self,
        token_budget: int,
        max_messages: int,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        changed: asyncio.Event | None = None,
    ) -> None:
        if token_budget < 1 or max_messages < 1 or window_s < 0:
            raise ValueError("token_budget and max_messages must be >= 1, window_s >= 0")
        self.token_budget = token_budget
        self.max_messages = max_messages
        self.window_s = window_s
        self._clock = clock
        self._closed: deque[_Batch[T]] = deque()
        self._open: _Batch[T] | None = None
        self._draining = False
        self._backlog = False
        self._changed = changed if changed is not None else asyncio.Event()  # set on every change

    # -- pure bookkeeping ---------------------------------------------------------------------

    def add(self, item: T, n_tokens: int, now: float | None = None) -> None:
        """Append ``item`` (``n_tokens``: what it costs the budget, its ``cost_tokens``: prefill
        tokens and at most its decode steps) to the open batch, closing batches as needed."""
        now = self._clock() if now is None else now
        b = self._open
        if b is not None and b.items and b.tokens + n_tokens > self.token_budget:
            self._close()
            b = None
        if b is None:
            b = self._open = _Batch(opened_at=now)
        b.items.append(item)
        b.sizes.append(n_tokens)
        b.tokens += n_tokens
        if b.tokens >= self.token_budget or len(b.items) >= self.max_messages:
            self._close()
        self._notify()

    def _close(self) -> None:
        if self._open is not None and self._open.items:
            self._closed.append(self._open)
        self._open = None

    def take(self, now: float | None = None) -> list[T] | None:
        """The next batch to run, or ``None`` if none is ready (closed, or open past its window)."""
        now = self._clock() if now is None else now
        if not self._closed and self._open is not None:
            if self._draining or (not self._backlog and now - self._open.opened_at >= self.window_s):
                self._close()
        if self._closed:
            return self._closed.popleft().items
        return None

    def seconds_until_ready(self, now: float | None = None) -> float | None:
        """0 if :meth:`take` would return a batch, the wait until the open batch's window ends,
        or ``None`` when no batch can be ready before the next change (nothing is waiting, or the
        open batch is held for a backlog)."""
        now = self._clock() if now is None else now
        if self._closed:
            return 0.0
        if self._open is None:
            return None
        if self._draining:
            return 0.0
        if self._backlog:
            return None
        return max(0.0, self._open.opened_at + self.window_s - now)

    def ready_since(self, now: float | None = None) -> float | None:
        """When the batch :meth:`take` would return was opened (clock seconds), or ``None`` when
        none is ready."""
        if self.seconds_until_ready(now) != 0.0:
            return None
        return self._closed[0].opened_at if self._closed else self._open.opened_at if self._open else None

    def set_backlog(self, waiting: bool) -> None:
        """Say whether more input is already there (read from the broker and being tokenized, or
        waiting in the broker): while it is, the open batch is not handed out on its window."""
        if waiting != self._backlog:
            self._backlog = waiting
            self._notify()

    @property
    def backlog(self) -> bool:
        return self._backlog

    def drain(self) -> None:
        """From now on hand out the open batch without waiting for its window (shutdown)."""
        self._draining = True
        self._notify()

    def discard(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return every waiting item for which ``predicate`` is true (revoked partitions)."""
        dropped: list[T] = []
        batches = list(self._closed) + ([self._open] if self._open is not None else [])
        for b in batches:
            flags = [predicate(it) for it in b.items]
            if any(flags):
                dropped.extend(it for it, f in zip(b.items, flags) if f)
                b.sizes = [n for n, f in zip(b.sizes, flags) if not f]
                b.items = [it for it, f in zip(b.items, flags) if not f]
                b.tokens = sum(b.sizes)
        self._closed = deque(b for b in self._closed if b.items)
        if self._open is not None and not self._open.items:
            self._open = None
        return dropped

    def __len__(self) -> int:
        """Items waiting (closed and open batches)."""
        return sum(len(b.items) for b in self._closed) + (len(self._open.items) if self._open else 0)

    @property
    def batches_ready(self) -> int:
        return len(self._closed)

    # -- asyncio ------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()

    async def next_batch(self) -> list[T]:
        """Wait for and return the next batch (see the module docstring for when one is ready)."""
        while True:
            batch = self.take()
            if batch is not None:
                return batch
            self._changed.clear()
            wait = self.seconds_until_ready()
            try:  # asyncio.timeout, not wait_for: a cancel arriving as the wait times out stays a cancel
                async with asyncio.timeout(wait):
                    await self._changed.wait()
            except TimeoutError:
                pass
