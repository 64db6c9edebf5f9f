"""``/healthz`` (liveness) and ``/readyz`` (readiness): the rules on a clock we control, then the
real endpoint of a service on the embedded broker with a fake engine we can make slow."""

from __future__ import annotations

import asyncio

import pytest

from spinf_stream.stream.service import ProduceFailed, ScoringService
from spinf_stream.telemetry.health import Health
from broker import (  # noqa: F401  (fixtures)
    FakeScorer,
    RunningService,
    Topics,
    fake_message,
    json_line,
    produce,
    run_settings,
    tansu,
    topics,
    wait_for,
)
from telemetry_helpers import probe, served


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- the rules ----------------------------------------------------------------------------------


def test_liveness_fails_when_records_wait_past_the_limit_with_none_written(caplog):
    clock = Clock()
    h = Health(stall_limit_s=10, clock=clock)
    h.beat()
    h.waiting(0)
    clock.t += 100  # nothing waits: idle is not a stall
    h.beat()
    assert h.liveness().ok and h.stalled_s() == 0
    h.waiting(7)
    clock.t += 9
    h.beat()
    assert h.liveness().ok
    h.progress()  # a record written: the clock restarts
    clock.t += 9
    h.beat()
    assert h.liveness().ok and h.stalled_s() == 9
    clock.t += 2
    h.beat()
    with caplog.at_level("WARNING"):
        c = h.liveness()
        h.liveness()
    assert not c.ok and c.reasons == ("7 records waiting, none written for 11 s (limit 10 s)",)
    assert c.detail["waiting_records"] == 7 and c.detail["stalled_s"] == 11
    assert [r.getMessage() for r in caplog.records] == ["liveness failing: " + c.reasons[0]]  # once
    h.waiting(0)
    assert h.liveness().ok


def test_liveness_fails_after_rebalances_in_a_row_without_a_written_record():
    clock = Clock()
    h = Health(stall_limit_s=10, clock=clock, rebalance_limit=3)
    h.beat()
    for _ in range(2):
        h.rebalanced()
    assert h.liveness().ok
    h.progress()
    for _ in range(2):
        h.rebalanced()
    assert h.liveness().ok  # the count restarted at the written record
    h.rebalanced()
    c = h.liveness()
    assert not c.ok and c.reasons == ("3 rebalances in a row with no record written (limit 3)",)
    h.progress()
    assert h.liveness().ok


def test_liveness_passes_while_the_model_loads_before_the_loop_starts():
    clock = Clock()
    h = Health(stall_limit_s=10, clock=clock)
    clock.t += 3600  # an hour-long load is the startup probe's business, not liveness'
    assert h.liveness().ok


def test_liveness_fails_when_the_event_loop_stops_turning_past_the_limit():
    clock = Clock()
    h = Health(stall_limit_s=10, clock=clock)
    h.beat()
    clock.t += 9.9
    assert h.liveness().ok
    clock.t += 0.2
    check = h.liveness()
    assert not check.ok and "event loop" in check.reasons[0]
    h.beat()
    assert h.liveness().ok


def test_liveness_fails_when_one_engine_batch_runs_past_the_limit():
    clock = Clock()
    h = Health(stall_limit_s=10, clock=clock)
    h.engine_busy()
    clock.t += 11
    h.beat()  # the loop still turns: only the engine is stuck
    check = h.liveness()
    assert not check.ok and "engine stuck" in check.reasons[0]
    h.engine_idle()
    assert h.liveness().ok


def test_readiness_needs_the_model_a_started_consumer_and_partitions():
    h = Health()
    assert set(h.readiness().reasons) == {"model not loaded", "consumer not started"}
    h.model_loaded()
    h.consumer_started()
    assert h.readiness().reasons == ("no partitions assigned",)
    h.assigned(2)
    assert h.readiness().ok


def test_readiness_is_lost_for_good_after_a_failure_and_while_stopping():
    def ready() -> Health:
        h = Health()
        h.model_loaded()
        h.consumer_started()
        h.assigned(1)
        return h

    h = ready()
    h.failed("ProduceFailed: broker said no")
    h.assigned(1)
    assert h.readiness().reasons == ("failed: ProduceFailed: broker said no",)
    h = ready()
    h.stopping()
    assert h.readiness().reasons == ("stopping",)


# -- the endpoint of a running service ----------------------------------------------------------

@pytest.mark.broker
def test_readyz_is_503_until_the_model_is_loaded_and_partitions_are_assigned_then_200(topics):
    t = topics(2)
    settings = run_settings(t)

    async def go() -> list[tuple[int, dict]]:
        with served(settings) as (telemetry, port):
            seen = [await asyncio.to_thread(probe, port, "/readyz")]  # nothing loaded yet
            svc = ScoringService(settings, FakeScorer(), make_message=fake_message, telemetry=telemetry)
            seen.append(await asyncio.to_thread(probe, port, "/readyz"))  # loaded, consumer not started
            async with RunningService(svc):
                seen.append(await asyncio.to_thread(probe, port, "/readyz"))
                seen.append(await asyncio.to_thread(probe, port, "/healthz"))
            seen.append(await asyncio.to_thread(probe, port, "/readyz"))  # stopped
        return seen

    (s0, b0), (s1, b1), (s2, b2), (s3, b3), (s4, b4) = asyncio.run(go())
    assert s0 == 503 and "model not loaded" in b0["reasons"]
    assert s1 == 503 and b1["reasons"] == ["consumer not started"]
    assert (s2, b2["ok"], b2["assigned_partitions"]) == (200, True, 2)
    assert (s3, b3["state"]) == (200, "running")
    assert s4 == 503 and "stopping" in b4["reasons"]


@pytest.mark.broker
def test_readyz_turns_503_after_a_fatal_error(topics):
    t = topics(1)
    produce(t, [json_line({"text": f"m{i}"}) for i in range(5)])
    settings = run_settings(t, max_batch_messages=1, window_ms=0)

    async def go() -> tuple[BaseException | None, tuple[int, dict]]:
        with served(settings) as (telemetry, port):
            svc = ScoringService(settings, FakeScorer(), make_message=fake_message, telemetry=telemetry)
            task = asyncio.create_task(svc.run())
            await wait_for(lambda: svc._producer is not None and svc._producer._sender is not None)

            async def refuse(*args, **kwargs):
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(RuntimeError("broker said no"))
                return fut

            svc._producer.send = refuse
            try:
                await asyncio.wait_for(task, 60)
                exc = None
            except BaseException as e:  # noqa: BLE001
                exc = e
            return exc, await asyncio.to_thread(probe, port, "/readyz")

    exc, after = asyncio.run(go())
    assert isinstance(exc, ProduceFailed)
    assert after[0] == 503
    assert any(r.startswith("failed: ProduceFailed") for r in after[1]["reasons"])


@pytest.mark.broker
def test_healthz_fails_while_the_engine_is_stuck_past_the_limit_and_recovers_after(topics):
    t = topics(1)
    settings = run_settings(t, liveness_timeout_s=0.5, window_ms=0)

    async def go() -> tuple[list[tuple[int, dict]], ScoringService]:
        seen: list[tuple[int, dict]] = []
        with served(settings) as (telemetry, port):
            svc = ScoringService(settings, FakeScorer(delay_s=2.5), make_message=fake_message, telemetry=telemetry)
            async with RunningService(svc):
                produce_task = asyncio.create_task(asyncio.to_thread(produce, t, [json_line({"text": "slow one"})]))
                await wait_for(lambda: svc.stats.batches >= 1, timeout_s=30)
                while svc.stats.acked < 1:
                    seen.append(await asyncio.to_thread(probe, port, "/healthz"))
                    await asyncio.sleep(0.1)
                await produce_task
                seen.append(await asyncio.to_thread(probe, port, "/healthz"))
        return seen, svc

    seen, svc = asyncio.run(go())
    failing = [b for s, b in seen if s == 503]
    assert failing, "liveness never failed while a 2.5 s batch ran against a 0.5 s limit"
    assert "engine stuck on one batch" in failing[0]["reasons"][0]
    assert seen[-1][0] == 200  # the batch finished: alive again


@pytest.mark.broker
def test_healthz_stays_200_while_batches_finish_within_the_limit(topics):
    t = topics(1)
    settings = run_settings(t, liveness_timeout_s=2.0, max_batch_messages=4, window_ms=0)
    n = 20

    async def go() -> list[int]:
        codes: list[int] = []
        with served(settings) as (telemetry, port):
            svc = ScoringService(settings, FakeScorer(delay_s=0.1), make_message=fake_message, telemetry=telemetry)
            async with RunningService(svc):
                await asyncio.to_thread(produce, t, [json_line({"text": f"m{i}"}) for i in range(n)])
                while svc.stats.acked < n:
                    codes.append((await asyncio.to_thread(probe, port, "/healthz"))[0])
                    await asyncio.sleep(0.05)
        return codes

    codes = asyncio.run(go())
    assert codes and set(codes) == {200}


def test_the_endpoint_answers_404_elsewhere():
    import urllib.error
    import urllib.request

    settings = run_settings(Topics("127.0.0.1:9", "in", "out", "dlq", 1))
    with served(settings) as (_, port):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=5)
    assert e.value.code == 404
