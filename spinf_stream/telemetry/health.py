"""Liveness and readiness of the scorer, as answered by ``/healthz`` and ``/readyz``.

**Live** (``/healthz``; a failing liveness probe restarts the container): the process is not
wedged. It fails when

- the service's event loop has not turned for ``stall_limit_s`` (the poll loop beats every
  ``POLL_TIMEOUT_MS``, 0.1 s, even while the partitions are paused), or
- the engine has been running one batch for longer than ``stall_limit_s``, or
- records are waiting (fetched and not yet written, or behind the group's committed offset) and
  none has been written for ``stall_limit_s``, or
- ``rebalance_limit`` rebalances came in a row with no record written between them (a member
  that keeps losing its partitions before it finishes anything).

Each of these is logged once at WARNING when it starts, with its reason.

The limit is ``--liveness-timeout-s`` (default 300 s): far above a normal batch (a 16,384-token
batch takes well under a minute on a CPU, under a second on a GPU) and equal to the default
``max.poll.interval.ms``, so a member that the probe would keep alive is one the group would too.
Loading the model is not a stall: before the service starts the check only says "starting" and
passes (Kubernetes' startup probe and ``start_period`` cover a load that never ends).

**Ready** (``/readyz``; a failing readiness probe takes the pod out of its Service, no restart):
the model is loaded, the consumer has started and owns at least one partition, the service is
not stopping, and no fatal error has occurred. A member without partitions (more replicas than
partitions) is alive but not ready.

The state is written from the event loop and read from the HTTP server's threads: every field is
a plain value replaced in one assignment, so a reader sees either the old or the new value.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_STALL_LIMIT_S = 300.0
DEFAULT_REBALANCE_LIMIT = 5

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Check:
    """The answer of one probe: ``ok`` and the reasons it is not (empty when ok)."""

    ok: bool
    reasons: tuple[str, ...] = ()
    detail: dict[str, object] | None = None


class Health:
    """Liveness and readiness state of one scorer process.

    Args:
        stall_limit_s: longest gap between event-loop beats, longest single engine batch, and
            longest time records wait with none written, before liveness fails (seconds).
        rebalance_limit: rebalances in a row without a written record before liveness fails.
        clock: monotonic clock in seconds (injected by tests).
    """

    def __init__(
        self, stall_limit_s: float = DEFAULT_STALL_LIMIT_S, clock: Callable[[], float] = time.monotonic,
        rebalance_limit: int = DEFAULT_REBALANCE_LIMIT,
    ) -> None:
        if stall_limit_s <= 0:
            raise ValueError("stall_limit_s must be positive")
        if rebalance_limit < 1:
            raise ValueError("rebalance_limit must be at least 1")
        self.stall_limit_s = stall_limit_s
        self.rebalance_limit = rebalance_limit
        self._waiting_since: float | None = None  # records wait, none written since then
        self._waiting = 0
        self._rebalances_idle = 0  # rebalances since the last written record
        self._warned: tuple[str, ...] = ()
        self._clock = clock
        self._model_loaded = False
        self._started = False  # the service's loop has begun beating
        self._last_beat = 0.0
        self._batch_since: float | None = None  # when the running engine batch started
        self._assigned = 0
        self._consumer_started = False
        self._stopping = False
        self._failure: str | None = None

    # -- written by the service -------------------------------------------------------------------

    def model_loaded(self) -> None:
        self._model_loaded = True

    def consumer_started(self) -> None:
        self._consumer_started = True

    def beat(self) -> None:
        """The event loop turned (called from the poll loop)."""
        self._last_beat = self._clock()
        self._started = True

    def engine_busy(self) -> None:
        self._batch_since = self._clock()

    def engine_idle(self) -> None:
        self._batch_since = None

    def assigned(self, n_partitions: int) -> None:
        self._assigned = n_partitions

    def progress(self) -> None:
        """A record was written (acknowledged by the broker)."""
        now = self._clock()
        if self._waiting_since is not None:
            self._waiting_since = now
        self._rebalances_idle = 0

    def waiting(self, n_records: int) -> None:
        """``n_records`` wait to be written: fetched and not written, plus the lag behind the
        committed offsets (the service's latest sample)."""
        self._waiting = n_records
        if n_records <= 0:
            self._waiting_since = None
        elif self._waiting_since is None:
            self._waiting_since = self._clock()

    def rebalanced(self) -> None:
        """The group took partitions away from this member."""
        self._rebalances_idle += 1

    def stalled_s(self) -> float:
        """Seconds records have waited with none written (0 when none waits)."""
        since = self._waiting_since
        return 0.0 if since is None else max(0.0, self._clock() - since)

    def stopping(self) -> None:
        self._stopping = True

    def failed(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason

    # -- read by the HTTP server ------------------------------------------------------------------

    def liveness(self) -> Check:
        """``ok`` unless the event loop or an engine batch is stuck past the limit, records wait
        with none written past the limit, or rebalances keep coming with nothing written."""
        now = self._clock()
        failing: list[tuple[str, str]] = []  # (kind, reason)
        if self._started:
            silent = now - self._last_beat
            if silent > self.stall_limit_s:
                failing.append(("loop", f"event loop has not turned for {silent:.0f} s (limit {self.stall_limit_s:.0f} s)"))
        since = self._batch_since
        if since is not None and now - since > self.stall_limit_s:
            failing.append(("engine", f"engine stuck on one batch for {now - since:.0f} s (limit {self.stall_limit_s:.0f} s)"))
        stalled = self.stalled_s()
        if stalled > self.stall_limit_s:
            failing.append(("progress", (
                f"{self._waiting} records waiting, none written for {stalled:.0f} s (limit {self.stall_limit_s:.0f} s)")))
        if self._rebalances_idle >= self.rebalance_limit:
            failing.append(("rebalances", (
                f"{self._rebalances_idle} rebalances in a row with no record written (limit {self.rebalance_limit})")))
        detail = {
            "state": "running" if self._started else "starting",
            "engine_batch_s": None if since is None else round(now - since, 3),
            "waiting_records": self._waiting,
            "stalled_s": round(stalled, 3),
            "rebalances_without_progress": self._rebalances_idle,
        }
        kinds = tuple(k for k, _ in failing)
        for kind, reason in failing:  # once per kind, when it starts
            if kind not in self._warned:
                log.warning("liveness failing: %s", reason)
        self._warned = kinds
        return Check(not failing, tuple(r for _, r in failing), detail)

    def readiness(self) -> Check:
        """``ok`` when the model is loaded, the consumer owns partitions, and nothing failed."""
        reasons = []
        if not self._model_loaded:
            reasons.append("model not loaded")
        if not self._consumer_started:
            reasons.append("consumer not started")
        elif self._assigned == 0:
            reasons.append("no partitions assigned")
        if self._stopping:
            reasons.append("stopping")
        if self._failure is not None:
            reasons.append(f"failed: {self._failure}")
        live = self.liveness()
        reasons.extend(live.reasons)
        return Check(not reasons, tuple(reasons), {"assigned_partitions": self._assigned})
