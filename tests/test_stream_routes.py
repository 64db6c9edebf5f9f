"""One service, several routes and lanes, on the real broker (Tansu), with deterministic stand-ins
for the engine: one record per (message, pack) on each pack's output topic, the ``spinf-pack``
header narrowing a record's packs, ``unknown_pack`` and ``no_route`` dead letters, a lane whose
model fails to load dead-lettering only its packs' records, per-partition order in each output
topic, and offsets committed only when every record a message owes is acknowledged."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import orjson

from broker import (  # noqa: F401  (fixtures)
    FakeScorer, RunningService, committed_offsets, fake_record, json_line, produce, read_all, run_settings, tansu,
    topics, wait_for,
)
from spinf_stream.routes import RoutesFile
from spinf_stream.stream.routing import router_for
from spinf_stream.stream.service import ScoringService
from spinf_stream.stream.topics import ensure_topics


def _fake(pack: str, model: str) -> FakeScorer:
    return FakeScorer(model_name=model, pack=SimpleNamespace(name=pack, version="1.0.0", fields=("text",)))


class LoadFails(FakeScorer):
    """A lane whose model cannot load: ``run`` raises what the engine pool raises."""

    def run(self, prepared: Any) -> Any:
        err = RuntimeError("model broken-model failed to load: corrupt safetensors header")
        err.error_kind = "model_load_failed"  # type: ignore[attr-defined]
        raise err


def _service(t: Any, routes: RoutesFile, scorers: dict[str, FakeScorer], **settings: Any) -> ScoringService:
    lanes = {k: scorers[f"{p.pack}/{p.model}"] for k, p in routes.lanes().items()}
    router = router_for(routes, {k: (s.pack.name, s.pack.version) for k, s in lanes.items()})
    budgets = {k: p.token_budget for k, p in routes.lanes().items()}
    s = run_settings(t, **settings)
    return ScoringService(s, lanes=lanes, router=router, budgets=budgets, make_message=_message)


def _spam_and_sentiment(t: Any, spam_model: str, sentiment_model: str) -> tuple[str, RoutesFile]:
    """One route: ``t``'s input scored by spam and sentiment, each to ``o-{tag}-{pack}`` (created)."""
    tag = uuid.uuid4().hex[:8]
    asyncio.run(ensure_topics(t.kafka, [f"o-{tag}-spam", f"o-{tag}-sentiment"], partitions=1))
    return tag, RoutesFile.model_validate({
        "dead_letter_topic": t.dlq,
        "routes": [{"topics": [t.input], "output_topic": f"o-{tag}-{{pack}}",
                    "packs": [{"pack": "spam", "model": spam_model}, {"pack": "sentiment", "model": sentiment_model}]}],
    })


def _message(message_id: str, fields: dict[str, Any]) -> Any:
    return SimpleNamespace(id=message_id, fields=fields)


def test_two_packs_on_one_topic_and_one_on_another_each_record_once_per_pack_in_order(topics):
    t = topics(2)
    tag = uuid.uuid4().hex[:8]
    reviews = f"reviews-{tag}"
    outs = {p: f"out-{tag}-{p}" for p in ("spam", "sentiment", "news")}
    asyncio.run(ensure_topics(t.kafka, [reviews, *outs.values()], partitions=2))
    routes = RoutesFile.model_validate({
        "dead_letter_topic": t.dlq,
        "routes": [
            {"topics": [t.input], "packs": [{"pack": "spam", "model": "m1"}, {"pack": "sentiment", "model": "m1"}],
             "output_topic": f"out-{tag}-{{pack}}"},
            {"topics": [reviews], "header": {"spinf-source": "shop"}, "packs": [{"pack": "news", "model": "m2"}],
             "output_topic": outs["news"]},
        ],
    })
    scorers = {"spam/m1": _fake("spam", "m1"), "sentiment/m1": _fake("sentiment", "m1"), "news/m2": _fake("news", "m2")}
    texts = [f"message number {i}" for i in range(40)]
    headers: list[Any] = [None] * 40
    headers[5] = [("spinf-pack", b"sentiment")]  # narrowed to one pack
    headers[6] = [("spinf-pack", b"news")]  # not allowed on this route
    keys = [b"k%d" % (i % 7) for i in range(40)]
    metas = produce(t, [json_line({"id": f"m{i}", "text": x}) for i, x in enumerate(texts)], keys=keys, headers=headers)
    shop = [[("spinf-source", b"shop")]] * 10 + [[("spinf-source", b"blog")]] * 2  # the last two: no route
    rmetas = produce(t, [json_line({"id": f"r{i}", "text": f"review {i}"}) for i in range(12)], headers=shop,
                     topic=reviews)
    owed = 38 * 2 + 1 + 1 + 10 + 2  # two packs each; the narrowed one; its unknown_pack; reviews; no_route

    async def go() -> ScoringService:
        svc = _service(t, routes, scorers)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked >= owed, timeout_s=60)
        return svc

    svc = asyncio.run(go())
    assert svc.stats.consumed == 52 and svc.stats.acked == owed
    by_topic: dict[str, list[Any]] = {}
    for name in [*outs.values(), t.dlq]:
        by_topic[name] = read_all(t, [name], idle_s=1.0)
    for pack in ("spam", "sentiment"):
        got = {orjson.loads(r.value)["id"]: r for r in by_topic[outs[pack]]}
        expect_ids = {f"m{i}" for i in range(40) if i != 6 and (i != 5 or pack == "sentiment")}
        assert set(got) == expect_ids, pack
        for i, text in enumerate(texts):
            if f"m{i}" in got:
                body = orjson.loads(got[f"m{i}"].value)
                want = fake_record(f"m{i}", text, scorers[f"{pack}/m1"])
                assert body["digest"] == want.digest and body["pack"]["name"] == pack
                assert dict(got[f"m{i}"].headers)["spinf-pack"] == f"{pack}@1.0.0".encode()
                assert dict(got[f"m{i}"].headers)["spinf-model"] == b"m1"
                assert got[f"m{i}"].key == keys[i]
        # per input partition, records come in offset order in this output topic
        seen: dict[int, list[int]] = defaultdict(list)
        for r in by_topic[outs[pack]]:
            src = orjson.loads(r.value)["source"]
            seen[src["partition"]].append(src["offset"])
        assert all(v == sorted(v) for v in seen.values()), seen
    news = {orjson.loads(r.value)["id"] for r in by_topic[outs["news"]]}
    assert news == {f"r{i}" for i in range(10)}
    dead = {tuple(orjson.loads(r.value)["source"].values())[:3]: (r, orjson.loads(r.value)) for r in by_topic[t.dlq]}
    assert len(dead) == len(by_topic[t.dlq]) == 3
    unknown = [b for r, b in dead.values() if b["error"]["kind"] == "unknown_pack"]
    assert len(unknown) == 1 and unknown[0]["id"] == "m6"
    assert "'news'" in unknown[0]["error"]["message"] and "spam@1.0.0, sentiment@1.0.0" in unknown[0]["error"]["message"]
    assert unknown[0]["pack"] is None  # two packs on its route: the dead letter names none
    no_route = [b for r, b in dead.values() if b["error"]["kind"] == "no_route"]
    assert sorted(b["source"]["offset"] for b in no_route) == sorted(m.offset for m in rmetas[10:])
    assert {b["id"] for b in no_route} == {"r10", "r11"} and all(b["pack"] is None for b in no_route)
    assert committed_offsets(t, svc.settings.group_id) == {p: sum(m.partition == p for m in metas) for p in (0, 1)}


def test_a_lane_whose_model_fails_to_load_dead_letters_only_its_pack_s_records(topics):
    t = topics(1)
    tag, routes = _spam_and_sentiment(t, "good", "broken")
    broken = LoadFails(model_name="broken", pack=SimpleNamespace(name="sentiment", version="1.0.0", fields=("text",)))
    scorers = {"spam/good": _fake("spam", "good"), "sentiment/broken": broken}
    produce(t, [json_line({"id": f"m{i}", "text": f"text {i}"}) for i in range(8)])

    async def go() -> ScoringService:
        svc = _service(t, routes, scorers)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked >= 16, timeout_s=60)
        return svc

    svc = asyncio.run(go())
    assert len(read_all(t, [f"o-{tag}-spam"], n=8)) == 8
    assert not read_all(t, [f"o-{tag}-sentiment"], idle_s=1.0)
    dead = [orjson.loads(r.value) for r in read_all(t, [t.dlq], n=8)]
    assert {d["error"]["kind"] for d in dead} == {"model_load_failed"}
    assert {d["id"] for d in dead} == {f"m{i}" for i in range(8)}
    assert all(d["pack"] == {"name": "sentiment", "version": "1.0.0"} and d["model"]["name"] == "broken" for d in dead)
    assert "corrupt safetensors" in dead[0]["error"]["message"]
    assert committed_offsets(t, svc.settings.group_id) == {0: 8}


def test_a_record_s_offset_waits_for_every_record_it_owes(topics):
    """The first pack is fast, the second slow: a message's records are released together once all
    are built, so while the second pack runs nothing of it is written and nothing committed."""
    t = topics(1)
    tag, routes = _spam_and_sentiment(t, "m", "m")
    slow = _fake("sentiment", "m")
    slow.delay_s = 3.0
    fast = _fake("spam", "m")
    scorers = {"spam/m": fast, "sentiment/m": slow}
    produce(t, [json_line({"id": f"m{i}", "text": f"text {i}"}) for i in range(3)])

    async def go() -> tuple[int, dict[Any, int], ScoringService]:
        svc = _service(t, routes, scorers, commit_interval_ms=50)
        async with RunningService(svc) as s:
            await wait_for(lambda: bool(fast.batches) and bool(slow.batches), timeout_s=30)  # spam's ran
            await asyncio.sleep(1.0)  # sentiment's batch still running
            early = (s.stats.acked, dict(s.stats.committed))
            await wait_for(lambda: s.stats.acked >= 6, timeout_s=30)
        return early[0], early[1], svc

    acked, committed, svc = asyncio.run(go())
    assert acked == 0 and not any(committed.values())
    assert committed_offsets(t, svc.settings.group_id) == {0: 3}
    assert len(read_all(t, [f"o-{tag}-spam", f"o-{tag}-sentiment"], n=6)) == 6


def test_metrics_carry_pack_and_model_and_say_which_models_are_loaded(topics):
    """Batch, engine and record metrics by (pack, model); queue depth per lane; the models in
    memory, their bytes, loads and evictions from the pool's numbers."""
    from spinf_stream.telemetry.recorder import ModelsSample
    from telemetry_helpers import scrape, served

    t = topics(1)
    tag, routes = _spam_and_sentiment(t, "m1", "m2")
    scorers = {"spam/m1": _fake("spam", "m1"), "sentiment/m2": _fake("sentiment", "m2")}
    produce(t, [json_line({"id": f"m{i}", "text": f"text {i}"}) for i in range(5)] + [b"not json"])
    lanes = {k: scorers[f"{p.pack}/{p.model}"] for k, p in routes.lanes().items()}
    router = router_for(routes, {k: (s.pack.name, s.pack.version) for k, s in lanes.items()})
    settings = run_settings(t, lag_interval_s=0.2)

    async def go() -> Any:
        with served(settings) as (telemetry, port):
            telemetry.watch_models(lambda: ModelsSample((("m1", 1000), ("m2", 2000)), loads=3, evictions=1))
            svc = ScoringService(settings, lanes=lanes, router=router, telemetry=telemetry, make_message=_message,
                                 budgets={k: 4096 for k in lanes})
            async with RunningService(svc) as s:
                await wait_for(lambda: s.stats.acked >= 11, timeout_s=60)
                await asyncio.sleep(0.5)  # a lag sample
                return await asyncio.to_thread(scrape, port)

    got = asyncio.run(go())
    pack, model = "spinf_pack_name", "spinf_model"
    for name in ("spinf_batch_messages_count", "spinf_forward_duration_seconds_count", "spinf_questions_answered_total",
                 "spinf_records_scored_total"):
        assert got.by(name, pack).keys() == {"spam", "sentiment"}, name
        assert got.by(name, model).keys() == {"m1", "m2"}, name
    assert got.value("spinf_records_scored_total", **{pack: "spam", model: "m1"}) == 5
    assert got.value("spinf_batch_messages_sum", **{pack: "sentiment", model: "m2"}) == 5
    assert got.value("spinf_records_dead_lettered_total", error_type="invalid_json") == 1  # no pack: read by none
    assert got.by("spinf_queue_depth", pack) == {"spam": 0.0, "sentiment": 0.0}
    assert got.by("spinf_info", pack).keys() == {"spam", "sentiment"}
    assert got.value("spinf_models_loaded") == 2 and got.by("spinf_model_memory_bytes", model) == {"m1": 1000, "m2": 2000}
    assert got.value("spinf_model_loads_total") == 3 and got.value("spinf_model_evictions_total") == 1


def test_backpressure_pauses_only_the_partition_whose_records_wait_in_a_slow_lane(topics):
    """Reviews go to a slow lane (1 s a batch), messages to a fast one, with --max-inflight 8 over
    the two partitions: the reviews partition pauses at its share (4) while messages keep being
    read and scored as they arrive; the total never passes 8; everything is scored."""
    t = topics(1)
    tag = uuid.uuid4().hex[:8]
    reviews = f"reviews-{tag}"
    asyncio.run(ensure_topics(t.kafka, [reviews, f"o-{tag}-spam", f"o-{tag}-sentiment"], partitions=1))
    routes = RoutesFile.model_validate({
        "dead_letter_topic": t.dlq,
        "routes": [{"topics": [t.input], "packs": [{"pack": "spam", "model": "fast"}], "output_topic": f"o-{tag}-{{pack}}"},
                   {"topics": [reviews], "packs": [{"pack": "sentiment", "model": "slow"}], "output_topic": f"o-{tag}-{{pack}}"}],
    })
    slow = _fake("sentiment", "slow")
    slow.delay_s = 1.0
    scorers = {"spam/fast": _fake("spam", "fast"), "sentiment/slow": slow}
    produce(t, [json_line({"id": f"r{i}", "text": f"review {i}"}) for i in range(16)], topic=reviews)
    paused_seen: set[str] = set()
    peak = 0

    async def go() -> ScoringService:
        nonlocal peak
        svc = _service(t, routes, scorers, max_inflight=8, max_batch_messages=4, window_ms=0)

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, svc._unacked())
                paused_seen.update(tp.topic for tp in svc.consumer.paused())
                await asyncio.sleep(0.005)

        async with RunningService(svc) as s:
            watcher = asyncio.create_task(watch())
            await wait_for(lambda: bool(slow.batches), timeout_s=30)
            for i in range(8):  # two a second while the reviews' backlog lasts (~4 s)
                await asyncio.to_thread(produce, t, [json_line({"id": f"m{i}", "text": f"message {i}"})])
                await asyncio.sleep(0.5)
            await wait_for(lambda: s.stats.acked >= 24, timeout_s=60)
            watcher.cancel()
        return svc

    asyncio.run(go())
    assert reviews in paused_seen, "the slow lane's partition never paused"
    assert t.input not in paused_seen, "the fast lane's partition paused for records it did not hold"
    assert peak <= 8
    assert len(read_all(t, [f"o-{tag}-spam"], n=8)) == 8 and len(read_all(t, [f"o-{tag}-sentiment"], n=16)) == 16
