"""The service's plumbing against a real broker (Tansu), with a fake engine for speed and control.

The issue's acceptance tests, with the real engine, are in ``test_stream_e2e.py``.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import orjson
import pytest

from spinf_stream.stream.service import ScoringService
from broker import (  # noqa: F401  (fixtures)
    FakeScorer,
    RunningService,
    committed_offsets,
    fake_message,
    json_line,
    produce,
    read_all,
    run_settings,
    source_of,
    tansu,
    topics,
    wait_for,
)

pytestmark = pytest.mark.broker


def score_all(t, settings, scorer, n_expected, timeout_s=60.0):
    """Run a service until ``n_expected`` records were acknowledged, then stop it gracefully."""

    async def go() -> ScoringService:
        svc = ScoringService(settings, scorer, make_message=fake_message)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked >= n_expected, timeout_s)
        return svc

    return asyncio.run(go())


def test_every_record_is_scored_once_keyed_like_its_input_in_partition_order(topics):
    t = topics(3)
    n = 300
    metas = produce(t, [json_line({"id": f"m{i}", "text": f"message number {i}"}) for i in range(n)],
                    keys=[f"user-{i % 11}".encode() for i in range(n)])
    score_all(t, run_settings(t, max_batch_messages=32), FakeScorer(), n)
    out = read_all(t, [t.output], n=n)
    assert len(out) == n
    by_source = {source_of(r): r for r in out}
    assert len(by_source) == n  # one record per input offset
    for i, m in enumerate(metas):
        rec = by_source[(t.input, m.partition, m.offset)]
        assert rec.key == f"user-{i % 11}".encode()
        assert orjson.loads(rec.value)["id"] == f"m{i}"
    # in input order per partition: within each output partition, offsets of one source partition increase
    seen: dict[tuple[int, int], int] = defaultdict(lambda: -1)
    for r in sorted(out, key=lambda r: (r.partition, r.offset)):
        _, sp, so = source_of(r)
        assert so > seen[(r.partition, sp)]
        seen[(r.partition, sp)] = so


def test_unkeyed_records_keep_their_partition_order(topics):
    t = topics(3)
    n = 120
    metas = produce(t, [json_line({"text": f"t{i}"}) for i in range(n)])
    score_all(t, run_settings(t, max_batch_messages=16), FakeScorer(), n)
    out = read_all(t, [t.output], n=n)
    for r in out:
        _, sp, _ = source_of(r)
        assert r.partition == sp  # output partition = input partition when there is no key
    ids = {orjson.loads(r.value)["id"] for r in out}
    assert ids == {f"{t.input}:{m.partition}:{m.offset}" for m in metas}  # default ids


def test_output_headers_carry_pack_model_device_dtype_and_traceparent(topics):
    t = topics(1)
    tp = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    produce(t, [json_line({"text": "hi"}), b"oops"], headers=[[("traceparent", tp)], [("traceparent", tp)]])
    score_all(t, run_settings(t), FakeScorer(), 2)
    for rec in read_all(t, [t.output, t.dlq], n=2):
        h = dict(rec.headers)
        assert h["spinf-pack"] == b"spam@1.0.0"
        assert h["spinf-model"] == b"fake-model"
        assert (h["spinf-device"], h["spinf-dtype"]) == (b"cpu", b"float32")
        assert h["traceparent"] == tp


def test_score_records_are_the_engine_records_plus_source(topics):
    t = topics(1)
    metas = produce(t, [json_line({"id": "a", "text": "hello"})])
    scorer = FakeScorer()
    score_all(t, run_settings(t), scorer, 1)
    (rec,) = read_all(t, [t.output], n=1)
    body = orjson.loads(rec.value)
    source = body.pop("source")
    assert source == {"topic": t.input, "partition": 0, "offset": 0, "timestamp": metas[0].timestamp}
    from broker import fake_record

    assert body == fake_record("a", "hello", scorer).model_dump(mode="json")


def test_offsets_are_committed_after_a_graceful_stop(topics):
    t = topics(3)
    n = 90
    metas = produce(t, [json_line({"text": f"x{i}"}) if i % 10 else b"not json" for i in range(n)])
    settings = run_settings(t, commit_interval_ms=10_000)  # only the final commit
    score_all(t, settings, FakeScorer(), n)
    last: dict[int, int] = {}
    for m in metas:
        last[m.partition] = max(last.get(m.partition, -1), m.offset)
    assert committed_offsets(t, settings.group_id) == {p: o + 1 for p, o in last.items()}


def test_a_message_that_crashes_the_engine_fails_alone(topics):
    t = topics(1)
    texts = ["fine one", "__crash_the_engine__", "fine two", "fine three"]
    produce(t, [json_line({"id": f"m{i}", "text": x}) for i, x in enumerate(texts)])
    score_all(t, run_settings(t, window_ms=200), FakeScorer(), len(texts))
    out = read_all(t, [t.output], n=3)
    assert sorted(orjson.loads(r.value)["id"] for r in out) == ["m0", "m2", "m3"]
    (dl,) = read_all(t, [t.dlq], n=1)
    body = orjson.loads(dl.value)
    assert body["error"]["kind"] == "engine_error" and body["id"] == "m1"


def test_too_long_reject_dead_letters_with_the_policy(topics):
    t = topics(1)
    produce(t, [json_line({"id": "long", "text": "word " * 400})])
    score_all(t, run_settings(t, too_long="reject"), FakeScorer(max_chars=100), 1)
    (dl,) = read_all(t, [t.dlq], n=1)
    assert orjson.loads(dl.value)["error"] | {"message": ""} == {"kind": "too_long", "message": "", "policy": "reject"}


def test_too_long_truncate_scores_the_longest_prefix_that_fits(topics):
    t = topics(1)
    text = "word " * 400
    produce(t, [json_line({"id": "long", "text": text})])
    scorer = FakeScorer(max_chars=100)
    score_all(t, run_settings(t, too_long="truncate"), scorer, 1)
    (rec,) = read_all(t, [t.output], n=1)
    body = orjson.loads(rec.value)
    assert body["truncated"] == {"policy": "truncate", "field": "text", "original_chars": len(text), "kept_chars": 100}
    from broker import fake_record

    assert body["scores"] == fake_record("long", text[:100], scorer).model_dump(mode="json")["scores"]


def test_text_input_format_scores_raw_text(topics):
    t = topics(1)
    produce(t, [b"just some text", "caf\u00e9 \u2615".encode(), b"\xff\xfe"])
    score_all(t, run_settings(t, input_format="text"), FakeScorer(), 3)
    assert len(read_all(t, [t.output], n=2)) == 2
    (dl,) = read_all(t, [t.dlq], n=1)
    assert orjson.loads(dl.value)["error"]["kind"] == "invalid_utf8"


def test_backpressure_pauses_partitions_and_bounds_in_flight_records(topics):
    t = topics(2)
    n = 200
    produce(t, [json_line({"text": f"m{i}"}) for i in range(n)])
    settings = run_settings(t, max_inflight=20, max_batch_messages=8, window_ms=0)
    seen_paused = False
    peak = 0

    async def go() -> None:
        nonlocal seen_paused, peak
        svc = ScoringService(settings, FakeScorer(delay_s=0.05), make_message=fake_message)
        async with RunningService(svc) as s:
            while s.stats.acked < n:
                peak = max(peak, s._unacked())
                seen_paused |= bool(s.consumer.paused())
                await asyncio.sleep(0.005)

    asyncio.run(go())
    assert seen_paused
    assert peak <= settings.max_inflight
    assert len(read_all(t, [t.output], n=n)) == n


def test_stop_drains_in_flight_work_writes_and_commits(topics):
    t = topics(2)
    n = 400
    metas = produce(t, [json_line({"text": f"m{i}"}) for i in range(n)])
    settings = run_settings(t, max_batch_messages=16, max_inflight=64, window_ms=0, commit_interval_ms=60_000)

    async def go() -> ScoringService:
        svc = ScoringService(settings, FakeScorer(delay_s=0.05), make_message=fake_message)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.consumed >= 50)
        return svc  # __aexit__ stopped it: drained

    svc = asyncio.run(go())
    assert 50 <= svc.stats.consumed < n  # stopped mid-stream
    assert svc.stats.acked == svc.stats.consumed  # every consumed record was written
    written = {source_of(r) for r in read_all(t, [t.output], n=svc.stats.acked)}
    committed = committed_offsets(t, settings.group_id)
    for m in metas:  # commits cover exactly what was written
        below = m.offset < committed.get(m.partition, 0)
        assert below == ((t.input, m.partition, m.offset) in written)


def test_a_rebalance_moves_partitions_without_losing_records(topics):
    t = topics(4)
    n = 400
    metas = produce(t, [json_line({"text": f"m{i}"}) for i in range(n)])
    settings = run_settings(t, max_batch_messages=16, max_inflight=64, window_ms=0)

    async def go() -> tuple[ScoringService, ScoringService]:
        a = ScoringService(settings, FakeScorer(delay_s=0.03), make_message=fake_message)
        b = ScoringService(settings, FakeScorer(delay_s=0.03), make_message=fake_message)
        async with RunningService(a):
            await wait_for(lambda: a.stats.acked >= 60)
            async with RunningService(b, assign_timeout_s=60):
                await wait_for(lambda: len(written()) >= n, timeout_s=90)
                assert a.stats.assignment and b.stats.assignment  # both members own partitions
                assert not a.stats.assignment & b.stats.assignment
        return a, b

    written_keys: set = set()

    def written() -> set:
        return written_keys

    async def watch() -> None:
        from spinf_stream.stream.consume import read_topics

        async for r in read_topics(t.kafka, [t.output]):
            written_keys.add(source_of(r))

    async def main():
        w = asyncio.create_task(watch())
        try:
            return await go()
        finally:
            w.cancel()

    a, b = asyncio.run(main())
    assert a.stats.rebalances >= 1
    assert written_keys == {(t.input, m.partition, m.offset) for m in metas}


def test_several_input_topics_are_scored(topics):
    t, u = topics(1), topics(2)
    produce(t, [json_line({"text": "from the first"})])
    produce(u, [json_line({"text": "from the second"})] * 3)
    score_all(t, run_settings(t, input_topic=[t.input, u.input]), FakeScorer(), 4)
    assert {source_of(r)[0] for r in read_all(t, [t.output], n=4)} == {t.input, u.input}


def test_message_content_is_never_logged(topics, caplog):
    import logging

    t = topics(1)
    secret = "hunter2-correct-horse"
    produce(t, [json_line({"id": "s1", "text": secret}), secret.encode(), json_line({"text": secret, "id": 5.5}),
                json_line({"text": secret * 2000})])
    with caplog.at_level(logging.DEBUG):
        score_all(t, run_settings(t, log_level="DEBUG"), FakeScorer(max_chars=1000), 4)
    assert caplog.records, "expected some logs at DEBUG"
    assert secret not in caplog.text


def test_a_failed_write_stops_the_service_without_committing_past_it(topics):
    t = topics(1)
    n = 30
    produce(t, [json_line({"text": f"m{i}"}) for i in range(n)])
    settings = run_settings(t, max_batch_messages=5, window_ms=0, commit_interval_ms=50)
    fail_at = 12  # the 13th record written fails

    async def go() -> tuple[BaseException | None, ScoringService]:
        svc = ScoringService(settings, FakeScorer(delay_s=0.02), make_message=fake_message)
        task = asyncio.create_task(svc.run())
        await wait_for(lambda: svc._producer is not None and svc._producer._sender is not None)
        real_send = svc._producer.send
        calls = 0

        async def send(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls - 1 == fail_at:
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(RuntimeError("broker said no"))
                return fut
            return await real_send(*args, **kwargs)

        svc._producer.send = send
        try:
            await asyncio.wait_for(task, 60)
        except BaseException as exc:  # noqa: BLE001
            return exc, svc
        return None, svc

    exc, svc = asyncio.run(go())
    from spinf_stream.stream.service import ProduceFailed

    assert isinstance(exc, ProduceFailed)
    assert committed_offsets(t, settings.group_id).get(0, 0) <= fail_at
