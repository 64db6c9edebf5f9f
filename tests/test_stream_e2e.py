"""The scorer service end to end: a real broker (Tansu) and the real engine (tiny random-weight
llama with SmolLM2's tokenizer and the shipped spam pack) — the acceptance tests of issue 3 §8.

- 2,000 real messages in → 2,000 records out, each equal to the offline score of its message;
- SIGKILL mid-stream and restart: nothing lost, commits never pass an unwritten record;
- a poison suite (≥ 15 kinds of bad input) among good messages;
- two scorers in one group split the partitions; kill one, the other finishes;
- a batch slower than max.poll.interval.ms does not make the member leave its group.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from spinf_stream.stream.consume import read_topics
from spinf_stream.stream.service import ScoringService
from broker import (  # noqa: F401  (fixtures)
    RunningService,
    Topics,
    committed_offsets,
    committed_offsets_async,
    json_line,
    produce,
    read_all,
    real_messages,
    run_settings,
    source_of,
    start_scorer_process,
    tansu,
    tiny_engine,
    tiny_model,
    topics,
    wait_for,
    wait_for_log,
)

pytestmark = pytest.mark.broker

TOKEN_BUDGET = 4096


def engine_settings(t: Topics, model: Path | str, **overrides: Any):
    return run_settings(t, model=str(model), pack="spam", token_budget=TOKEN_BUDGET, **overrides)


def offline_scores(engine: Any, messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{id: record}`` from the offline ``spinf-stream score`` path (``offline.score_file``)."""
    import tempfile

    from spinf_stream.cli.offline import score_file

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "in.jsonl", Path(d) / "out.jsonl"
        src.write_bytes(b"".join(orjson.dumps(m) + b"\n" for m in messages))
        score_file(engine, str(src), str(dst), progress=False)
        records = [orjson.loads(line) for line in dst.read_bytes().splitlines()]
    assert len(records) == len(messages) and all("digest" in r for r in records)
    return {r["id"]: r for r in records}


class Collector:
    """Reads the output and dead-letter topics in the background; ``sources`` = input offsets covered."""

    def __init__(self, t: Topics) -> None:
        self.t = t
        self.records: list[Any] = []
        self.sources: set[tuple[str, int, int]] = set()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async for rec in read_topics(self.t.kafka, [self.t.output, self.t.dlq]):
            self.records.append(rec)
            self.sources.add(source_of(rec))

    def __enter__(self) -> Collector:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._task is not None
        self._task.cancel()


def input_offsets(t: Topics, metas: list[Any]) -> set[tuple[str, int, int]]:
    return {(t.input, m.partition, m.offset) for m in metas}


# -- 2,000 real messages -------------------------------------------------------------------------


def test_2000_real_messages_give_2000_records_equal_to_offline_scores(topics, tiny_engine, tiny_model):
    t = topics(3)
    messages = real_messages("sms_spam", 2000)
    metas = produce(t, [json_line(m) for m in messages], keys=[m["id"].encode() for m in messages])
    settings = engine_settings(t, tiny_model)

    async def go() -> ScoringService:
        svc = ScoringService(settings, tiny_engine)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked >= len(messages) or s.stats.dead_lettered > 0, timeout_s=900, interval_s=0.2)
        return svc

    svc = asyncio.run(go())
    assert svc.stats.dead_lettered == 0
    out = read_all(t, [t.output], n=len(messages))
    assert len(out) == len(messages)
    assert {source_of(r) for r in out} == input_offsets(t, metas)

    offline = offline_scores(tiny_engine, messages)
    for rec in out:
        body = orjson.loads(rec.value)
        want = offline[body["id"]]
        assert body["digest"] == want["digest"]
        assert body["scores"] == want["scores"]  # floats parsed back: bitwise equal
        assert {k: v for k, v in body.items() if k != "source"} == want
    # committed up to the end of every partition
    end: dict[int, int] = {}
    for m in metas:
        end[m.partition] = max(end.get(m.partition, 0), m.offset + 1)
    assert committed_offsets(t, settings.group_id) == end


# -- SIGKILL and restart ---------------------------------------------------------------------------


async def _assert_commits_cover_only_written(t: Topics, group: str, metas: list[Any], covered: set) -> dict[int, int]:
    committed = await committed_offsets_async(t, group)
    for m in metas:
        if m.offset < committed.get(m.partition, 0):
            assert (t.input, m.partition, m.offset) in covered, f"offset {m.partition}@{m.offset} committed but never written"
    return committed


def test_sigkill_mid_stream_then_restart_loses_nothing(topics, tiny_model, tmp_path):
    t = topics(3)
    messages = real_messages("sms_spam", 400)
    values = [json_line(m) for m in messages]
    keys = [m["id"].encode() for m in messages]
    headers: list[Any] = [None] * len(values)
    # dead letters count as written too; among them the kinds that once stopped a partition
    values[17] = b"not json at all"
    values[41], keys[41] = b"{not json", b"K" * (1 << 20)  # a 1 MiB key: the dead letter is cut to fit
    values[63], headers[63] = b"[1, 2", [(f"h{i}", b"x" * 1024) for i in range(1000)]  # 1,000 headers of 1 KB
    values[85] = json_line({"id": "big", "text": "y" * 30_000})  # over --max-message-bytes
    values[107] = json_line({"id": "invisible", "text": "\u200b\u0301\u00a0"})
    metas = produce(t, values, keys=keys, headers=headers, max_request_size=4 << 20)
    settings = engine_settings(
        t, tiny_model, max_batch_messages=4, max_inflight=16, window_ms=0, commit_interval_ms=100,
        session_timeout_ms=6000, heartbeat_interval_ms=500, max_message_bytes=20_000,
    )
    log = tmp_path / "scorer.log"

    async def go() -> None:
        with Collector(t) as col:
            proc = start_scorer_process(settings, log)
            try:
                await wait_for(lambda: len(col.sources) >= 40 or proc.poll() is not None, timeout_s=300, interval_s=0.05)
                assert proc.poll() is None, log.read_text()[-3000:]
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            await asyncio.sleep(1.0)  # let the collector catch up with what was written
            assert len(col.sources) < len(metas), "the scorer finished before it was killed"
            committed = await _assert_commits_cover_only_written(t, settings.group_id, metas, col.sources)
            assert sum(committed.values()) > 0, "nothing was committed before the kill"

            proc = start_scorer_process(settings, log)
            try:
                await wait_for(lambda: col.sources >= input_offsets(t, metas) or proc.poll() is not None, timeout_s=300, interval_s=0.1)
                assert col.sources >= input_offsets(t, metas), log.read_text()[-3000:]
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=120) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
            end: dict[int, int] = {}
            for m in metas:
                end[m.partition] = max(end.get(m.partition, 0), m.offset + 1)
            assert await _assert_commits_cover_only_written(t, settings.group_id, metas, col.sources) == end
            await asyncio.sleep(1.0)
            # duplicates only where at-least-once allows them: records not committed at the kill
            from collections import Counter

            twice = [src for src, n in Counter(source_of(r) for r in col.records).items() if n > 1]
            assert all(src[2] >= committed.get(src[1], 0) for src in twice), twice
            kinds = {orjson.loads(r.value)["error"]["kind"] for r in col.records if "error" in orjson.loads(r.value)}
            assert kinds == {"invalid_json", "too_long", "empty_field"}

    asyncio.run(go())


# -- poison suite ----------------------------------------------------------------------------------

LONG_TEXT = "word " * 6000  # far past the tiny model's 2,048 positions


def poison_cases() -> list[tuple[str, bytes | None, list[tuple[str, bytes]] | None, str]]:
    """(name, value, headers, expected dead-letter kind) — one per kind of bad input."""
    j = json_line
    return [
        ("invalid utf-8", b"\xff\xfe\xfd not utf-8", None, "invalid_utf8"),
        ("utf-8 cut mid-character", b'{"text": "caf\xc3"}', None, "invalid_utf8"),
        ("plain text", b"hello, this is not json", None, "invalid_json"),
        ("truncated json", b'{"id": "x", "text": "unterminated', None, "invalid_json"),
        ("lone surrogate escape", b'{"text": "\\udc00"}', None, "invalid_json"),
        ("NaN literal", b'{"text": "a", "score": NaN}', None, "invalid_json"),
        ("nested too deep", b"[" * 5000 + b"]" * 5000, None, "invalid_json"),
        ("json array", j(["text", "hello"]), None, "not_an_object"),
        ("json string", j("hello"), None, "not_an_object"),
        ("json number", b"12345", None, "not_an_object"),
        ("json null", b"null", None, "not_an_object"),
        ("empty value", b"", None, "empty_value"),
        ("tombstone", None, None, "null_value"),
        ("missing text", j({"id": "p-missing", "body": "hello"}), None, "missing_field"),
        ("text is null", j({"id": "p-null", "text": None}), None, "missing_field"),
        ("text is a number", j({"id": "p-num", "text": 42}), None, "wrong_type"),
        ("text is an object", j({"id": "p-obj", "text": {"a": 1}}), None, "wrong_type"),
        ("text is a list", j({"id": "p-list", "text": ["a"]}), None, "wrong_type"),
        ("text is empty", j({"id": "p-empty", "text": ""}), None, "empty_field"),
        ("text is whitespace", j({"id": "p-ws", "text": " \n\t "}), None, "empty_field"),
        # zero-width space, zero-width joiner, a combining acute with no base, no-break space, bidi mark
        ("text is invisible", j({"id": "p-invisible", "text": "\u200b\u200d\u0301\u00a0\u200f"}), None, "empty_field"),
        ("id is a boolean", j({"id": True, "text": "hello"}), None, "wrong_type"),
        ("id is an object", j({"id": {"n": 1}, "text": "hello"}), None, "wrong_type"),
        ("id is empty", j({"id": "", "text": "hello"}), None, "empty_field"),
        ("text too long", j({"id": "p-long", "text": LONG_TEXT}), None, "too_long"),
        ("another pack asked for", j({"id": "p-pack", "text": "hello"}), [("spinf-pack", b"sentiment")], "unknown_pack"),
        ("pack version mismatch", j({"id": "p-ver", "text": "hello"}), [("spinf-pack", b"spam@9.9.9")], "unknown_pack"),
    ]


def test_poison_messages_go_to_the_dead_letter_topic_and_good_ones_are_scored(topics, tiny_engine, tiny_model):
    cases = poison_cases()
    assert len({c[3] for c in cases}) >= 10 and len(cases) >= 15
    t = topics(2)
    good = real_messages("sms_spam", 2 * len(cases) + 10)
    values, headers, expect = [], [], []  # expect[i] = dead-letter kind or None for good
    gi = iter(good)
    for case in cases:
        for _ in range(2):
            m = next(gi)
            values.append(json_line(m)), headers.append(None), expect.append(None)
        values.append(case[1]), headers.append(case[2]), expect.append(case)
    for m in gi:
        values.append(json_line(m)), headers.append(None), expect.append(None)
    keys = [b"k%d" % (i % 5) for i in range(len(values))]
    metas = produce(t, values, keys=keys, headers=headers)
    settings = engine_settings(t, tiny_model, too_long="reject")

    async def go() -> ScoringService:
        svc = ScoringService(settings, tiny_engine)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked >= len(values), timeout_s=600, interval_s=0.1)
        return svc

    asyncio.run(go())
    n_bad = len(cases)
    dead = {source_of(r): r for r in read_all(t, [t.dlq], n=n_bad)}
    scored = {source_of(r): r for r in read_all(t, [t.output], n=len(values) - n_bad)}
    assert len(dead) == n_bad and len(scored) == len(values) - n_bad
    offline = offline_scores(tiny_engine, good)
    for meta, value, key, case in zip(metas, values, keys, expect):
        src = (t.input, meta.partition, meta.offset)
        if case is None:
            body = orjson.loads(scored[src].value)
            assert body["digest"] == offline[body["id"]]["digest"]
            continue
        name, _, _, kind = case
        rec = dead[src]
        body = orjson.loads(rec.value)
        assert body["error"]["kind"] == kind, name
        assert body["error"]["message"], name
        assert body["source"]["offset"] == meta.offset
        given = orjson.loads(value).get("id") if kind in ("unknown_pack", "empty_field", "missing_field") else None
        if isinstance(given, str) and given:  # a dead letter carries the id when the value has one
            assert body["id"] == given, name
        assert (None if body["value_b64"] is None else base64.b64decode(body["value_b64"])) == value, name
        assert base64.b64decode(body["key_b64"]) == key
        assert dict(rec.headers)["spinf-error-kind"] == kind.encode()
        if kind == "too_long":
            assert body["error"]["policy"] == "reject"


def test_too_long_truncate_scores_a_prefix_like_offline(topics, tiny_engine, tiny_model):
    t = topics(1)
    produce(t, [json_line({"id": "long", "text": LONG_TEXT})])
    settings = engine_settings(t, tiny_model, too_long="truncate")

    async def go() -> None:
        async with RunningService(ScoringService(settings, tiny_engine)) as s:
            await wait_for(lambda: s.stats.acked >= 1, timeout_s=300)

    asyncio.run(go())
    (rec,) = read_all(t, [t.output], n=1)
    body = orjson.loads(rec.value)
    cut = body["truncated"]
    assert cut["field"] == "text" and cut["original_chars"] == len(LONG_TEXT) and 0 < cut["kept_chars"] < len(LONG_TEXT)
    kept = LONG_TEXT[: cut["kept_chars"]]
    assert body["digest"] == offline_scores(tiny_engine, [{"id": "long", "text": kept}])["long"]["digest"]
    # the longest prefix: one more character no longer fits
    from spinf_stream.engine import Message

    (over,) = tiny_engine.prepare([Message(id="x", fields={"text": LONG_TEXT[: cut["kept_chars"] + 1]})])
    assert getattr(over, "error", None) is not None and over.error.kind == "too_long"


# -- two scorers in one group --------------------------------------------------------------------


def _assigned(log: Path) -> list[str]:
    lines = [li for li in log.read_text(errors="replace").splitlines() if "assigned partitions:" in li]
    if not lines:
        return []
    tail = lines[-1].split("assigned partitions:", 1)[1].strip()
    return [] if tail == "none" else [p.strip() for p in tail.split(",")]


def test_two_scorers_split_the_partitions_and_one_finishes_when_the_other_dies(topics, tiny_model, tmp_path):
    t = topics(4)
    messages = real_messages("sms_spam", 800)
    first, second = messages[:100], messages[100:]
    settings = engine_settings(
        t, tiny_model, max_batch_messages=4, max_inflight=16, window_ms=0, commit_interval_ms=100,
        session_timeout_ms=6000, heartbeat_interval_ms=500,
    )
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"

    async def go() -> None:
        metas = await produce_async(t, first)
        with Collector(t) as col:
            a = start_scorer_process(settings, log_a)
            b = None
            try:
                await asyncio.to_thread(wait_for_log, log_a, "assigned partitions:", a)
                b = start_scorer_process(settings, log_b)
                deadline = time.monotonic() + 180
                while not (_assigned(log_a) and _assigned(log_b) and len(_assigned(log_a)) + len(_assigned(log_b)) == 4):
                    assert time.monotonic() < deadline, (log_a.read_text()[-2000:], log_b.read_text()[-2000:])
                    assert a.poll() is None and b.poll() is None
                    await asyncio.sleep(0.1)
                split_a, split_b = set(_assigned(log_a)), set(_assigned(log_b))
                assert split_a and split_b and not split_a & split_b
                b_parts = {int(p.rsplit("[", 1)[1].rstrip("]")) for p in split_b}
                # more messages while both run; kill B once it has written some of them
                later = await produce_async(t, second)
                metas += later
                later_b = {(t.input, m.partition, m.offset) for m in later if m.partition in b_parts}
                await wait_for(lambda: len(col.sources & later_b) >= 20 or b.poll() is not None, timeout_s=300, interval_s=0.05)
                b.send_signal(signal.SIGKILL)
                b.wait()
                assert not later_b <= col.sources, "B finished its share before the kill: use more messages"
                await wait_for(lambda: col.sources >= input_offsets(t, metas) or a.poll() is not None, timeout_s=400, interval_s=0.1)
                assert col.sources >= input_offsets(t, metas), log_a.read_text()[-3000:]
                assert len(_assigned(log_a)) == 4  # the survivor took over every partition
                a.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(a.wait, 120) == 0
            finally:
                for p in (a, b):
                    if p is not None and p.poll() is None:
                        p.kill()
            end: dict[int, int] = {}
            for m in metas:
                end[m.partition] = max(end.get(m.partition, 0), m.offset + 1)
            assert await _assert_commits_cover_only_written(t, settings.group_id, metas, col.sources) == end

    asyncio.run(go())


async def produce_async(t: Topics, messages: list[dict[str, Any]]) -> list[Any]:
    from spinf_stream.stream.produce import produce_values

    return await produce_values(t.kafka, t.input, [json_line(m) for m in messages], keys=[m["id"].encode() for m in messages])


# -- a batch slower than max.poll.interval.ms ------------------------------------------------------


class SlowEngine:
    """The real engine whose ``run`` first sleeps ``delay_s`` (a batch that takes long)."""

    def __init__(self, engine: Any, delay_s: float) -> None:
        self._engine, self.delay_s = engine, delay_s
        self.model_info, self.pack = engine.model_info, engine.pack

    def prepare(self, messages: Any) -> Any:
        return self._engine.prepare(messages)

    def run(self, prepared: Any) -> Any:
        time.sleep(self.delay_s)
        return self._engine.run(prepared)


def test_a_batch_slower_than_max_poll_interval_keeps_the_member_in_its_group(topics, tiny_engine, tiny_model):
    t = topics(2)
    messages = real_messages("sms_spam", 12)
    produce(t, [json_line(m) for m in messages])
    max_poll_ms = 2000
    settings = engine_settings(
        t, tiny_model, max_poll_interval_ms=max_poll_ms, session_timeout_ms=3000, heartbeat_interval_ms=300,
        max_batch_messages=6, window_ms=0,
    )
    engine = SlowEngine(tiny_engine, delay_s=2.5 * max_poll_ms / 1000)

    async def go() -> tuple[ScoringService, tuple[str, int], tuple[str, int]]:
        svc = ScoringService(settings, engine)
        async with RunningService(svc) as s:
            coord = s.consumer._coordinator
            before = (coord.member_id, coord.generation)
            t0 = time.monotonic()
            await wait_for(lambda: s.stats.acked >= len(messages), timeout_s=300, interval_s=0.1)
            assert time.monotonic() - t0 > 2 * max_poll_ms / 1000  # the batches did outlast the interval
            after = (coord.member_id, coord.generation)
        return svc, before, after

    svc, before, after = asyncio.run(go())
    assert before == after  # same member, same generation: never left, never rejoined
    assert svc.stats.rebalances == 0
    assert svc.stats.batches >= 2
    assert len(read_all(t, [t.output], n=len(messages))) == len(messages)
