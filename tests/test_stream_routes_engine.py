"""``run --routes`` with the real engine pool on tiny random-weight models, on the real broker:
two packs on one topic with one model and a pack on another topic with a second model, records
bitwise equal to offline scoring with that pack and model; models swapped under a budget that
fits one; a model that fails to load dead-letters only its route; SIGKILL during two-pack batches
loses nothing."""

from __future__ import annotations

import asyncio
import shutil
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from broker import (  # noqa: F401  (fixtures)
    RunningService, committed_offsets, committed_offsets_async, json_line, produce, read_all, real_messages, run_settings,
    start_scorer_process, tansu, topics, wait_for,
)
from spinf_stream.engine import Engine, Message
from spinf_stream.engine.pool import EnginePool
from spinf_stream.routes import RoutesFile
from spinf_stream.stream.consume import read_topics
from spinf_stream.stream.routing import router_for
from spinf_stream.stream.service import ScoringService
from spinf_stream.stream.topics import ensure_topics

BUDGET = 512  # tokens per pass: several batches per lane


@pytest.fixture(scope="module")
def models(tiny_models) -> dict[str, str]:
    return {f: str(tiny_models(f)) for f in ("llama", "qwen2")}


def _offline(model: str, pack: str, messages: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """``{id: (digest, model name)}`` of offline scoring with ``Engine.load``."""
    engine = Engine.load(model=model, pack=pack, token_budget=BUDGET)
    return {r.id: (r.digest, r.model.name) for r in engine.score([Message(id=m["id"], fields=m) for m in messages])}


def _routes(t: Any, reviews: str, tag: str, m1: str, m2: str) -> RoutesFile:
    return RoutesFile.model_validate({
        "dead_letter_topic": t.dlq,
        "routes": [
            {"topics": [t.input], "output_topic": f"o-{tag}-{{pack}}",
             "packs": [{"pack": "spam", "model": m1, "token_budget": BUDGET},
                       {"pack": "sentiment", "model": m1, "token_budget": BUDGET}]},
            {"topics": [reviews], "output_topic": f"o-{tag}-reviews",
             "packs": [{"pack": "sentiment", "model": m2, "token_budget": BUDGET}]},
        ],
    })


def _service(t: Any, routes: RoutesFile, pool: EnginePool, swap_wait_s: float = 0.5) -> ScoringService:
    lanes = {k: pool.lane(p.pack, p.model, token_budget=p.token_budget) for k, p in routes.lanes().items()}
    router = router_for(routes, {k: (str(s.pack.name), str(s.pack.version)) for k, s in lanes.items()})
    return ScoringService(
        run_settings(t), lanes=lanes, router=router, budgets={k: p.token_budget for k, p in routes.lanes().items()},
        housekeeping=pool.evict_idle, swap_wait_s=swap_wait_s,
    )


@pytest.mark.parametrize("fits", ["both", "one"])
def test_two_routes_two_models_records_equal_offline_scores_and_swaps_under_a_budget(topics, models, fits):
    t = topics(2)
    tag = uuid.uuid4().hex[:8]
    reviews = f"reviews-{tag}"
    asyncio.run(ensure_topics(t.kafka, [reviews, f"o-{tag}-spam", f"o-{tag}-sentiment", f"o-{tag}-reviews"], 2))
    messages = real_messages("sms_spam", 24)
    opinions = [{"id": f"r{i}", "text": m["text"]} for i, m in enumerate(real_messages("sms_spam", 40)[24:])]
    routes = _routes(t, reviews, tag, models["llama"], models["qwen2"])
    pool = EnginePool()
    svc = _service(t, routes, pool)  # registers the lanes: the estimates need them
    sizes = {m: pool.estimate_bytes(m) for m in (models["llama"], models["qwen2"])}
    pool.budget_bytes = sum(sizes.values()) + 1 if fits == "both" else max(sizes.values()) + 1
    metas = produce(t, [json_line(m) for m in messages], keys=[m["id"].encode() for m in messages])
    produce(t, [json_line(m) for m in opinions], topic=reviews)

    async def go() -> None:
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked >= 2 * len(messages) + len(opinions), timeout_s=300, interval_s=0.1)

    asyncio.run(go())
    assert svc.stats.dead_lettered == 0
    for pack in ("spam", "sentiment"):
        want = _offline(models["llama"], pack, messages)
        got = {orjson.loads(r.value)["id"]: orjson.loads(r.value) for r in read_all(t, [f"o-{tag}-{pack}"], n=24)}
        assert {k: (v["digest"], v["model"]["name"]) for k, v in got.items()} == want, pack
    want = _offline(models["qwen2"], "sentiment", opinions)
    got = {b["id"]: (b["digest"], b["model"]["name"]) for b in
           (orjson.loads(r.value) for r in read_all(t, [f"o-{tag}-reviews"], n=16))}
    assert got == want
    if fits == "both":
        assert pool.loads == 2 and pool.evictions == 0
    else:  # each load after the first evicts the other model; the policy keeps swaps to a few, not one a batch
        batches = svc.stats.batches
        assert pool.evictions == pool.loads - 1 and 2 <= pool.loads <= 4, (pool.loads, batches)
        assert batches >= 8
    end = {p: 1 + max(m.offset for m in metas if m.partition == p) for p in {m.partition for m in metas}}
    assert committed_offsets(t, svc.settings.group_id) == end


def test_a_model_that_fails_to_load_dead_letters_only_its_route(topics, models, tmp_path):
    t = topics(1)
    tag = uuid.uuid4().hex[:8]
    reviews = f"reviews-{tag}"
    asyncio.run(ensure_topics(t.kafka, [reviews, f"o-{tag}-spam", f"o-{tag}-sentiment", f"o-{tag}-reviews"], 1))
    broken = tmp_path / "broken"
    shutil.copytree(models["qwen2"], broken)
    for f in broken.glob("*.safetensors"):
        f.write_bytes(b"\x00" * 64)
    routes = _routes(t, reviews, tag, models["llama"], str(broken))
    svc = _service(t, routes, EnginePool())
    messages = real_messages("sms_spam", 6)
    produce(t, [json_line(m) for m in messages])
    produce(t, [json_line({"id": f"r{i}", "text": "a review"}) for i in range(4)], topic=reviews)

    async def go() -> None:
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked >= 12 + 4, timeout_s=300, interval_s=0.1)

    asyncio.run(go())
    assert len(read_all(t, [f"o-{tag}-spam", f"o-{tag}-sentiment"], n=12)) == 12
    dead = [orjson.loads(r.value) for r in read_all(t, [t.dlq], n=4)]
    assert sorted(d["id"] for d in dead) == ["r0", "r1", "r2", "r3"]
    assert {d["error"]["kind"] for d in dead} == {"model_load_failed"}
    assert "broken" in dead[0]["error"]["message"] and dead[0]["pack"]["name"] == "sentiment"
    assert not read_all(t, [f"o-{tag}-reviews"], idle_s=1.0)


def test_sigkill_during_two_pack_batches_then_restart_loses_nothing(topics, models, tmp_path):
    t = topics(2)
    tag = uuid.uuid4().hex[:8]
    outs = [f"o-{tag}-spam", f"o-{tag}-sentiment"]
    asyncio.run(ensure_topics(t.kafka, outs, 2))
    routes_file = tmp_path / "routes.yaml"
    routes_file.write_text(orjson.dumps({
        "dead_letter_topic": t.dlq,
        "routes": [{"topics": [t.input], "output_topic": f"o-{tag}-{{pack}}",
                    "packs": [{"pack": "spam", "model": models["llama"], "token_budget": BUDGET},
                              {"pack": "sentiment", "model": models["llama"], "token_budget": BUDGET}]}],
    }).decode())  # JSON is YAML
    messages = real_messages("sms_spam", 160)
    values = [json_line(m) for m in messages]
    values[30] = b"not json"  # one dead letter (a record no pack read)
    metas = produce(t, values, keys=[m["id"].encode() for m in messages])
    settings = run_settings(t, routes=str(routes_file), max_batch_messages=4, max_inflight=16, window_ms=0,
                            commit_interval_ms=100, session_timeout_ms=6000, heartbeat_interval_ms=500)
    # the flags a routes file replaces, at their defaults: not passed to the process
    settings = settings.model_copy(update={"input_topic": ["messages"], "output_topic": "scores", "dlq_topic": "scores.dlq"})
    log = tmp_path / "scorer.log"
    owed = {(t.input, m.partition, m.offset): (1 if i == 30 else 2) for i, m in enumerate(metas)}
    records: list[Any] = []

    async def collect() -> None:
        async for rec in read_topics(t.kafka, [*outs, t.dlq]):
            records.append(rec)

    def covered() -> Counter[tuple[str, int, int]]:
        got: Counter[tuple[str, int, int]] = Counter()
        for src, _topic in {(_src(r), r.topic) for r in records}:
            got[src] += 1
        return got

    async def go() -> dict[int, int]:
        task = asyncio.create_task(collect())
        try:
            proc = start_scorer_process(settings, log)
            try:
                await wait_for(lambda: len(records) >= 40 or proc.poll() is not None, timeout_s=300, interval_s=0.05)
                assert proc.poll() is None, log.read_text()[-3000:]
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            await asyncio.sleep(1.0)
            assert len(records) < 2 * len(metas) - 1, "the scorer finished before it was killed"
            committed = await committed_offsets_async(t, settings.group_id)
            assert sum(committed.values()) > 0, "nothing was committed before the kill"
            have = covered()
            for src, n in owed.items():  # a committed offset: every record it owes was written
                if src[2] < committed.get(src[1], 0):
                    assert have[src] == n, (src, have[src])
            proc = start_scorer_process(settings, log)
            try:
                await wait_for(lambda: all(covered()[s] == n for s, n in owed.items()) or proc.poll() is not None,
                               timeout_s=300, interval_s=0.1)
                assert all(covered()[s] == n for s, n in owed.items()), log.read_text()[-3000:]
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=120) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
            return committed
        finally:
            task.cancel()

    committed = asyncio.run(go())
    end = {p: 1 + max(m.offset for m in metas if m.partition == p) for p in {m.partition for m in metas}}
    assert committed_offsets(t, settings.group_id) == end
    twice = [(src, topic) for (src, topic), n in Counter((_src(r), r.topic) for r in records).items() if n > 1]
    assert all(src[2] >= committed.get(src[1], 0) for src, _ in twice), twice  # only what was not committed


def _src(rec: Any) -> tuple[str, int, int]:
    s = orjson.loads(rec.value)["source"]
    return (s["topic"], s["partition"], s["offset"])
