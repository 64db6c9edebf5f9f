"""The micro-batcher: batches close on token budget, message cap, or latency window; a backlog
holds a partial batch past its window."""

from __future__ import annotations

import asyncio
import time

import pytest

from spinf_stream.stream.batcher import Batcher


def make(budget: int = 100, cap: int = 10, window_s: float = 0.05) -> Batcher[str]:
    return Batcher(budget, cap, window_s, clock=lambda: 0.0)


def test_nothing_is_ready_before_the_window():
    b = make()
    b.add("a", 10, now=0.0)
    assert b.take(now=0.049) is None
    assert b.seconds_until_ready(now=0.01) == pytest.approx(0.04)


def test_the_open_batch_is_handed_out_once_the_window_has_passed():
    b = make()
    b.add("a", 10, now=0.0)
    b.add("b", 10, now=0.03)
    assert b.take(now=0.05) == ["a", "b"]  # window counts from the first message
    assert b.take(now=1.0) is None


def test_a_batch_closes_when_the_next_message_would_exceed_the_budget():
    b = make(budget=100)
    b.add("a", 60, now=0.0)
    b.add("b", 50, now=0.0)  # 110 > 100: "a" closes alone
    assert b.take(now=0.0) == ["a"]
    assert b.take(now=0.0) is None  # "b" is still open
    assert b.take(now=0.05) == ["b"]


def test_a_batch_that_reaches_the_budget_closes_at_once():
    b = make(budget=100)
    b.add("a", 40, now=0.0)
    b.add("b", 60, now=0.0)
    assert b.take(now=0.0) == ["a", "b"]


def test_a_message_larger_than_the_budget_gets_a_batch_of_its_own():
    b = make(budget=100)
    b.add("small", 10, now=0.0)
    b.add("huge", 500, now=0.0)
    b.add("after", 10, now=0.0)
    assert b.take(now=0.0) == ["small"]
    assert b.take(now=0.0) == ["huge"]
    assert b.take(now=0.0) is None


def test_the_message_cap_closes_a_batch():
    b = make(cap=3)
    for x in "abcd":
        b.add(x, 1, now=0.0)
    assert b.take(now=0.0) == ["a", "b", "c"]
    assert len(b) == 1


def test_closed_batches_come_out_in_order():
    b = make(cap=2)
    for x in "abcdef":
        b.add(x, 1, now=0.0)
    assert [b.take(now=0.0) for _ in range(3)] == [["a", "b"], ["c", "d"], ["e", "f"]]


def test_while_the_engine_is_busy_the_open_batch_keeps_filling():
    # nobody calls take() during the engine's run: the window passes, messages keep coming
    b = make(budget=1000, cap=100)
    for i in range(30):
        b.add(str(i), 10, now=i * 0.01)
    assert b.take(now=0.3) == [str(i) for i in range(30)]


def test_drain_hands_out_the_open_batch_without_waiting():
    b = make()
    b.add("a", 10, now=0.0)
    b.drain()
    assert b.seconds_until_ready(now=0.0) == 0.0
    assert b.take(now=0.0) == ["a"]


def test_window_zero_hands_out_at_once():
    b = make(window_s=0.0)
    b.add("a", 10, now=5.0)
    assert b.take(now=5.0) == ["a"]


def test_discard_removes_items_from_open_and_closed_batches():
    b = make(cap=2)
    for x in ["a1", "b1", "a2", "b2", "a3"]:
        b.add(x, 30, now=0.0)
    dropped = b.discard(lambda x: x.startswith("a"))
    assert sorted(dropped) == ["a1", "a2", "a3"]
    assert b.take(now=0.0) == ["b1"]
    assert b.take(now=0.0) == ["b2"]
    assert len(b) == 0


def test_discard_frees_the_tokens_of_the_open_batch():
    b = make(budget=100, cap=10)
    b.add("x", 60, now=0.0)
    b.discard(lambda s: s == "x")
    b.add("y", 60, now=0.0)
    b.add("z", 40, now=0.0)  # 100 fits exactly once "x" is gone
    assert b.take(now=0.0) == ["y", "z"]


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError):
        Batcher(0, 1, 0.0)
    with pytest.raises(ValueError):
        Batcher(1, 0, 0.0)
    with pytest.raises(ValueError):
        Batcher(1, 1, -1.0)


def test_next_batch_waits_for_the_window():
    async def go() -> tuple[list[str], float]:
        b: Batcher[str] = Batcher(100, 10, 0.1)
        t0 = time.monotonic()
        b.add("a", 1)
        batch = await b.next_batch()
        return batch, time.monotonic() - t0

    batch, waited = asyncio.run(go())
    assert batch == ["a"]
    assert 0.09 <= waited < 1.0


def test_next_batch_wakes_when_a_batch_closes():
    async def go() -> list[str]:
        b: Batcher[str] = Batcher(100, 2, 10.0)
        task = asyncio.create_task(b.next_batch())
        await asyncio.sleep(0.01)
        b.add("a", 1)
        b.add("b", 1)  # cap reached: closes long before the 10 s window
        return await asyncio.wait_for(task, 1.0)

    assert asyncio.run(go()) == ["a", "b"]


def test_a_backlog_holds_the_open_batch_past_its_window():
    b = make(window_s=0.05)
    b.set_backlog(True)  # more records read and being tokenized
    b.add("a", 10, now=0.0)
    assert b.take(now=10.0) is None
    assert b.seconds_until_ready(now=10.0) is None  # nothing ready until something changes


def test_once_the_backlog_is_read_the_window_applies_again():
    b = make(window_s=0.05)
    b.set_backlog(True)
    b.add("a", 10, now=0.0)
    b.add("b", 10, now=0.2)
    b.set_backlog(False)
    assert b.take(now=0.2) == ["a", "b"]  # the window (from "a") passed long ago


def test_a_batch_held_for_a_backlog_still_closes_on_the_budget():
    b = make(budget=100, window_s=0.05)
    b.set_backlog(True)
    b.add("a", 60, now=0.0)
    b.add("b", 50, now=1.0)  # would exceed the budget: "a" closes
    assert b.take(now=1.0) == ["a"]
    assert b.take(now=2.0) is None  # "b" is held while the backlog lasts


def test_drain_hands_out_a_batch_held_for_a_backlog():
    b = make()
    b.set_backlog(True)
    b.add("a", 10, now=0.0)
    b.drain()
    assert b.take(now=0.0) == ["a"]


def test_next_batch_wakes_when_the_backlog_is_read():
    async def go() -> tuple[list[str], float]:
        b: Batcher[str] = Batcher(100, 10, 0.0)
        b.set_backlog(True)
        b.add("a", 1)
        task = asyncio.create_task(b.next_batch())
        await asyncio.sleep(0.1)
        assert not task.done()  # held: window 0, but a backlog is being read
        t0 = time.monotonic()
        b.set_backlog(False)
        batch = await asyncio.wait_for(task, 1.0)
        return batch, time.monotonic() - t0

    batch, waited = asyncio.run(go())
    assert batch == ["a"]
    assert waited < 0.5
