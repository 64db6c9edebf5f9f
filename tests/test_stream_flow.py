"""The service keeps the engine full: a backlog fills batches up to the token budget, while the
latency window still bounds the wait of input that trickles in.

The engine is a stand-in of fixed speed: tokenizing takes a fixed time per message and a forward
pass a fixed time per token (a real engine's cost on one machine), so batch sizes and waits are
the service's doing. The broker is real (Tansu).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from spinf_stream.stream.service import ScoringService
from spinf_stream.telemetry import StreamTelemetry
from broker import (  # noqa: F401  (fixtures)
    FakePrepared,
    FakeScorer,
    RunningService,
    fake_message,
    json_line,
    produce,
    read_all,
    run_settings,
    tansu,
    topics,
)

pytestmark = pytest.mark.broker


@dataclass
class FixedSpeedScorer(FakeScorer):
    """:class:`broker.FakeScorer` that takes ``prepare_s`` per message to tokenize and
    ``seconds_per_token`` per packed token to run; it records the ids it tokenized, in order, and
    the tokens of each message of each batch it ran."""

    prepare_s: float = 0.0
    seconds_per_token: float = 0.0
    tokenized: list[str] = field(default_factory=list)
    batch_tokens: list[list[int]] = field(default_factory=list)

    def prepare(self, messages: Sequence[Any]) -> list[Any]:
        time.sleep(self.prepare_s * len(messages))
        self.tokenized.extend(m.id for m in messages)
        return super().prepare(messages)

    def run(self, prepared: Sequence[FakePrepared]) -> list[Any]:
        tokens = [p.n_tokens for p in prepared]
        self.batch_tokens.append(tokens)
        time.sleep(self.seconds_per_token * sum(tokens))
        return super().run(prepared)


class Waits(StreamTelemetry):
    """Telemetry (no exporter) that keeps, in seconds, each record's queue time (read → its batch
    starts) and processing time (read → the broker acknowledges its score). The time before the
    read is the broker's delivery, not the service's (Tansu answers a fetch at its own pace)."""

    def __init__(self) -> None:
        super().__init__()
        self.queued: list[float] = []
        self.processed: list[float] = []

    def batch_started(self, headers: Sequence[Any], waited_s: Sequence[float], tokens: int, **lane: Any) -> Any:
        self.queued.extend(waited_s)
        return super().batch_started(headers, waited_s, tokens, **lane)

    def acked(self, topic: str, partition: int, timestamp_ms: int | None, read_at: float, *args: Any, **kwargs: Any) -> None:
        self.processed.append(time.monotonic() - read_at)
        super().acked(topic, partition, timestamp_ms, read_at, *args, **kwargs)


def fake_tokens(text: str) -> int:
    """Tokens ``FakeScorer.prepare`` gives a text (its definition)."""
    return 10 + len(text) // 4


def greedy_batches(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Messages in order, each batch closed only when the next message would take it past the
    budget (or it reached the budget): what a budget-filling batcher makes of a backlog."""
    batches: list[list[int]] = []
    current: list[int] = []
    for n in sizes:
        if current and sum(current) + n > budget:
            batches.append(current)
            current = []
        current.append(n)
        if sum(current) >= budget:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches


def test_a_backlog_fills_each_batch_up_to_the_token_budget(topics):
    # 400 messages waiting before the service starts; tokenizing the first 128-message chunk takes
    # ~64 ms, past the 20 ms window, and holds fewer tokens than the budget: a batcher that
    # applied the window to the backlog would hand the engine a partial first batch.
    t = topics(3)
    texts = [f"message {i}: " + "word " * (i * 7 % 40) for i in range(400)]
    produce(t, [json_line({"id": f"m{i}", "text": x}) for i, x in enumerate(texts)])
    tokens_of = {f"m{i}": fake_tokens(x) for i, x in enumerate(texts)}
    budget = 6000
    assert sum(tokens_of.values()) > 2 * budget  # several batches
    scorer = FixedSpeedScorer(prepare_s=0.0005, seconds_per_token=0.0001)
    settings = run_settings(t, token_budget=budget, window_ms=20)

    async def go() -> None:
        svc = ScoringService(settings, scorer, make_message=fake_message)
        async with RunningService(svc) as s:
            await asyncio.wait_for(s.wait_acked(len(texts)), 60)

    asyncio.run(go())
    assert sorted(scorer.tokenized) == sorted(tokens_of)  # each message tokenized once
    expected = greedy_batches([tokens_of[i] for i in scorer.tokenized], budget)
    assert scorer.batch_tokens == expected
    assert all(sum(b) > budget - max(tokens_of.values()) for b in expected[:-1])  # i.e. full


def test_the_window_still_bounds_the_wait_when_input_trickles(topics):
    # one message every 0.4 s, a 100 ms window, ~12 ms per message in the engine: each message
    # waits at most the window before its pass starts, then one pass; nothing is held back for
    # a batch that input this slow would take seconds to fill.
    t = topics(1)
    window_s, gap_s, n = 0.1, 0.4, 10
    scorer = FixedSpeedScorer(seconds_per_token=0.001)
    waits = Waits()
    settings = run_settings(t, window_ms=int(window_s * 1000))

    async def go() -> None:
        svc = ScoringService(settings, scorer, make_message=fake_message, telemetry=waits)
        async with RunningService(svc) as s:
            producer = AIOKafkaProducer(bootstrap_servers=t.bootstrap, acks="all", linger_ms=0)
            await producer.start()
            try:
                for i in range(n):
                    await producer.send_and_wait(t.input, json_line({"text": f"trickle {i}"}))
                    await asyncio.sleep(gap_s)
            finally:
                await producer.stop()
            await asyncio.wait_for(s.wait_acked(n), 60)

    asyncio.run(go())
    assert [len(b) for b in scorer.batch_tokens] == [1] * n
    pass_s = max(scorer.seconds_per_token * b[0] for b in scorer.batch_tokens)
    slack_s = 0.15  # event-loop turns and broker round trips on a shared machine
    assert max(waits.queued) <= window_s + slack_s, waits.queued
    assert max(waits.processed) <= window_s + 2 * pass_s + slack_s, waits.processed
