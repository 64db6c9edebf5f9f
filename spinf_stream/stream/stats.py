"""The scoring service's counters, for logs, tests and benchmarks (no content)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka import TopicPartition


@dataclass
class ServiceStats:
    """Counters since :meth:`~spinf_stream.stream.service.ScoringService.run` started."""

    consumed: int = 0
    scored: int = 0
    dead_lettered: int = 0
    acked: int = 0
    batches: int = 0
    batch_messages: int = 0
    batch_tokens: int = 0  # packed tokens of every batch (fill = batch_tokens / batches / budget)
    engine_seconds: float = 0.0  # time the engine spent on batches (wall, from run_measured)
    commits: int = 0
    rebalances: int = 0
    skipped: int = 0  # records the broker refused for their size (reported, not written)
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    assignment: set[TopicPartition] = field(default_factory=set)
    first_consumed_at: float | None = None  # time.monotonic() of the first consumed record
    last_acked_at: float | None = None  # time.monotonic() of the latest acknowledgement
