"""No record stops a partition: each kind of bad record, produced between good ones on one
partition of the real broker (Tansu), is dead-lettered with its reason; every good record is
scored exactly once, in order; the committed offset passes the bad one; a restart reads nothing
again. Plus the parser guard on bytes the broker would not store, liveness without progress, the
ops endpoint under a burst, and a double SIGTERM.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from typing import Any

import orjson
import pytest

from spinf_stream.stream.service import ScoringService
from broker import (  # noqa: F401  (fixtures)
    CLI,
    REPO,
    FakeScorer,
    RunningService,
    committed_offsets,
    fake_message,
    json_line,
    produce,
    produce_raw,
    raw_batch,
    read_all,
    run_settings,
    scorer_args,
    source_of,
    tansu,
    tiny_engine,
    tiny_model,
    topics,
    wait_for,
)

pytestmark = pytest.mark.broker

GOOD = [{"id": f"good-{i}", "text": f"good message number {i}, nothing wrong with it"} for i in range(4)]


def _run(t, settings, scorer, n_expected, make_message=fake_message, timeout_s=120.0):
    async def go() -> ScoringService:
        svc = ScoringService(settings, scorer, make_message=make_message)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked + getattr(s.stats, "skipped", 0) >= n_expected, timeout_s)
            await asyncio.sleep(0.3)  # one commit interval
        return svc

    return asyncio.run(go())


def check_kind(t, settings, scorer, bad_offset: int, kind: str, make_message=fake_message, n_total: int = 5) -> tuple[Any, Any]:
    """Run a scorer over ``t``'s one partition (``n_total`` records, one bad at ``bad_offset``) and
    check the four promises; returns (the dead letter, the service)."""
    svc = _run(t, settings, scorer, n_total, make_message)
    assert svc.stats.rebalances == 0
    scored = read_all(t, [t.output], n=n_total - 1)
    assert [source_of(r)[2] for r in scored] == [o for o in range(n_total) if o != bad_offset]  # once, in order
    (dl,) = read_all(t, [t.dlq], n=1)
    body = orjson.loads(dl.value)
    assert body["error"]["kind"] == kind and body["error"]["message"]
    assert body["source"]["offset"] == bad_offset
    assert committed_offsets(t, settings.group_id) == {0: n_total}  # past the bad record
    again = _run(t, settings, scorer, 0)  # a restart: nothing is consumed again
    assert again.stats.consumed == 0
    assert len(read_all(t, [t.output, t.dlq], idle_s=1.0)) == n_total
    return dl, body


def _values_around(bad: bytes | None) -> list[bytes | None]:
    v = [json_line(m) for m in GOOD]
    return v[:2] + [bad] + v[2:]


def test_a_1mb_key_on_bad_json_is_dead_lettered_cut_to_fit(topics):
    t = topics(1)
    key = bytes(range(256)) * 4096  # 1 MiB
    produce(t, _values_around(b"not json"), keys=[b"k"] * 2 + [key] + [b"k"] * 2, max_request_size=4 << 20)
    dl, body = check_kind(t, run_settings(t), FakeScorer(), 2, "invalid_json")
    cut = {c["part"]: c for c in body["cut"]}
    assert cut["key"]["size"] == len(key) and cut["key"]["sha256"] == hashlib.sha256(key).hexdigest()
    assert key.startswith(base64.b64decode(body["key_b64"])) and dl.key == base64.b64decode(body["key_b64"])
    assert base64.b64decode(body["value_b64"]) == b"not json"  # the small value is kept whole


def test_1000_headers_of_1kb_on_bad_json_are_dead_lettered_cut_to_fit(topics):
    t = topics(1)
    headers = [(f"h-{i}", bytes([i % 256]) * 1024) for i in range(1000)]
    produce(t, _values_around(b"{broken"), headers=[None, None, headers, None, None], max_request_size=4 << 20)
    _, body = check_kind(t, run_settings(t), FakeScorer(), 2, "invalid_json")
    cut = {c["part"]: c for c in body["cut"]}
    assert cut["headers"]["count"] == 1000 and 0 < cut["headers"]["kept"] < 1000
    assert [h["key"] for h in body["headers"]] == [k for k, _ in headers[: cut["headers"]["kept"]]]


def test_a_header_key_that_is_not_utf8_is_dead_lettered_as_undecodable(topics):
    t = topics(1)
    produce(t, [json_line(m) for m in GOOD[:2]])
    produce_raw(t, 0, raw_batch([
        (b"k", json_line({"id": "bad-key", "text": "fine text"}), [(b"\xff\xfe-key", b"v"), (b"ok", b"1")]),
        (None, json_line(GOOD[2]), [(b"fine", b"header")]),  # in the same batch: still scored
    ]))
    produce(t, [json_line(GOOD[3])])
    _, body = check_kind(t, run_settings(t), FakeScorer(), 2, "undecodable_record")
    assert "not UTF-8" in body["error"]["message"]
    assert base64.b64decode(body["value_b64"]) == json_line({"id": "bad-key", "text": "fine text"})
    assert base64.b64decode(body["headers"][0]["key_b64"]) == b"\xff\xfe-key"


def test_a_value_over_max_message_bytes_is_too_long_unread(topics):
    t = topics(1)
    limit = 10_000
    big = json_line({"id": "big", "text": "x" * limit})
    assert len(big) > limit
    produce(t, _values_around(big))
    _, body = check_kind(t, run_settings(t, max_message_bytes=limit), FakeScorer(max_chars=10**9), 2, "too_long")
    assert str(limit) in body["error"]["message"] and body["id"] is None  # not parsed


def test_a_score_record_over_the_size_limit_is_dead_lettered_record_too_large(topics):
    t = topics(1)
    long_id = "i" * 6000  # its score record repeats it: over a 4,096-byte limit
    produce(t, _values_around(json_line({"id": long_id, "text": "a fine text"})))
    _, body = check_kind(t, run_settings(t, max_request_size=4096), FakeScorer(), 2, "record_too_large")
    assert "4096" in body["error"]["message"]
    assert {c["part"] for c in body["cut"]} == {"value"}  # the dead letter itself was cut to fit


def test_a_record_refused_for_its_size_is_skipped_counted_and_committed_past(topics, caplog):
    t = topics(1)
    produce(t, _values_around(b"x" * 50_000))  # bad JSON: a 67 kB dead letter when kept whole
    settings = run_settings(t, max_request_size=8192)

    async def go() -> ScoringService:
        svc = ScoringService(settings, FakeScorer(), make_message=fake_message)

        async def believed_limit() -> int:  # a limit the producer does not share (e.g. a stale topic config)
            return 10**7

        svc._record_limit = believed_limit  # type: ignore[method-assign]
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked + s.stats.skipped >= 5, 60)
            await asyncio.sleep(0.3)
        return svc

    with caplog.at_level("ERROR"):
        svc = asyncio.run(go())
    assert svc.stats.skipped == 1 and svc.stats.acked == 4
    assert [source_of(r)[2] for r in read_all(t, [t.output], n=4)] == [0, 1, 3, 4]
    assert not read_all(t, [t.dlq], idle_s=1.0)
    assert any(f"{t.input}[0]@2" in r.getMessage() and "refused for its size" in r.getMessage() for r in caplog.records)
    assert committed_offsets(t, settings.group_id) == {0: 5}


@pytest.mark.parametrize("policy", ["truncate", "reject"])
def test_a_5mb_text_does_not_hold_the_poll_loop(topics, tiny_engine, policy):
    t = topics(1)
    huge = "lorem ipsum dolor sit amet " * (5_000_000 // 27)
    produce(t, _values_around(json_line({"id": "huge", "text": huge})), max_request_size=8 << 20)
    settings = run_settings(t, too_long=policy, max_message_bytes=8 << 20, max_poll_interval_ms=5000,
                            session_timeout_ms=6000, heartbeat_interval_ms=500)
    from spinf_stream.engine import Message

    def make(i, f):
        return Message(id=i, fields=f)

    started = time.monotonic()
    if policy == "reject":
        _, body = check_kind(t, settings, tiny_engine, 2, "too_long", make_message=make)
        assert body["error"]["policy"] == "reject" and body["id"] == "huge"
        assert {c["part"] for c in body["cut"]} == {"value"}  # the 5 MB value, cut to fit
    else:
        svc = _run(t, settings, tiny_engine, 5, make)
        assert svc.stats.rebalances == 0 and svc.stats.dead_lettered == 0
        scored = read_all(t, [t.output], n=5)
        assert [source_of(r)[2] for r in scored] == [0, 1, 2, 3, 4]
        cut = orjson.loads(scored[2].value)["truncated"]
        assert cut["original_chars"] == len(huge) and 0 < cut["kept_chars"] < 20_000
        # the prefix kept is the longest the engine accepts: one more character is too long
        over = tiny_engine.prepare([Message(id="x", fields={"text": huge[: cut["kept_chars"] + 1]})])[0]
        assert getattr(over, "error", None) is not None and over.error.kind == "too_long"
        assert committed_offsets(t, settings.group_id) == {0: 5}
    assert time.monotonic() - started < 60


class _StuckPrepare(FakeScorer):
    """Tokenization that takes ``stuck_s`` for a text starting with "stuck"."""

    stuck_s: float = 0.0

    def prepare(self, messages):
        for m in messages:
            if str(m.fields.get("text", "")).startswith("stuck"):
                time.sleep(self.stuck_s)
        return super().prepare(messages)


def test_a_message_slower_than_max_prepare_s_is_too_slow_and_the_member_stays(topics):
    t = topics(1)
    produce(t, _values_around(json_line({"id": "slow", "text": "stuck here"})))
    scorer = _StuckPrepare()
    scorer.stuck_s = 7.0  # beyond the 5 s poll interval and the 2 s bound
    settings = run_settings(t, max_prepare_s=2.0, max_poll_interval_ms=5000, session_timeout_ms=6000,
                            heartbeat_interval_ms=500)
    _, body = check_kind(t, settings, scorer, 2, "too_slow")
    assert body["id"] == "slow" and "2 s" in body["error"]["message"]


def test_healthz_fails_when_records_wait_and_none_is_written(topics):
    t = topics(1)
    produce(t, [json_line({"id": "stuck", "text": "stuck forever"})] + [json_line(m) for m in GOOD])
    scorer = _StuckPrepare()
    scorer.stuck_s = 8.0
    settings = run_settings(t, liveness_timeout_s=2.0, lag_interval_s=0.2, max_prepare_s=60.0)
    from spinf_stream.telemetry import create_telemetry

    telemetry = create_telemetry(settings, prometheus=False)

    async def go() -> tuple[Any, Any, Any]:
        svc = ScoringService(settings, scorer, make_message=fake_message, telemetry=telemetry)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.consumed >= 5, 30)
            healthy = telemetry.health.liveness()
            await asyncio.sleep(3.0)
            stalled = telemetry.health.liveness()
            await wait_for(lambda: s.stats.acked >= 5, 30)
            await asyncio.sleep(0.5)
            recovered = telemetry.health.liveness()
        return healthy, stalled, recovered

    healthy, stalled, recovered = asyncio.run(go())
    assert healthy.ok
    assert not stalled.ok and any("none written" in r for r in stalled.reasons), stalled
    assert stalled.detail["waiting_records"] >= 5
    assert recovered.ok, recovered


def test_ops_endpoint_answers_probes_during_a_1000_connection_burst():
    from spinf_stream.telemetry.health import Health
    from spinf_stream.telemetry.server import OpsServer

    server = OpsServer("127.0.0.1", 0, Health(), None).start()
    socks = []
    try:
        for _ in range(1000):  # connections that never send a request (slowloris)
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", server.port))
            socks.append(s)
        time.sleep(0.5)
        for _ in range(5):
            t0 = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as r:
                assert r.status == 200
            assert time.monotonic() - t0 < 5
    finally:
        for s in socks:
            s.close()
        server.stop()


def _start_scorer(settings, log, prefix: list[str] = ()) -> subprocess.Popen[bytes]:
    """``spinf-stream run`` in its own session, its output appended to ``log``, no SPINF_ settings
    but the model cache from this environment."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    with open(log, "ab") as out:
        return subprocess.Popen([*prefix, *CLI, "run", *scorer_args(settings)], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _assigned_count(log) -> int:
    return log.read_text(errors="replace").count("assigned partitions:")


@pytest.mark.real_model
def test_a_second_sigterm_stops_at_once_with_exit_130_and_loses_nothing(topics, tmp_path):
    # smollm2-135m, real weights: with a tiny model no pass is long enough to be caught mid-way,
    # and the abort (exit 134, "terminate called without an active exception") came from there
    t = topics(1)
    messages = [{"id": f"m{i}", "text": f"message {i} about a prize you have won " * 8} for i in range(60)]
    produce(t, [json_line(m) for m in messages])
    settings = run_settings(t, model="smollm2-135m", pack="spam", max_batch_messages=32, window_ms=0,
                            commit_interval_ms=100, metrics_port=0)
    log = tmp_path / "scorer.log"

    def start(prefix: list[str]) -> subprocess.Popen[bytes]:
        return _start_scorer(settings, log, prefix)

    def wait_assigned(proc: subprocess.Popen[bytes], n: int) -> None:
        deadline = time.monotonic() + 180
        while _assigned_count(log) < n:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)

    # two kill -TERM 50 ms apart, mid-batch
    proc = start([])
    try:
        wait_assigned(proc, 1)
        time.sleep(1.5)  # inside the first batch's passes
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=30)
        assert time.monotonic() - t0 < 16
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text(errors="replace")
    assert rc == 130, f"exit {rc}\n{text[-3000:]}"
    # GNU timeout signals the scorer, then its process group: two signals that the kernel may
    # merge into one (a pending signal is not queued twice): a drain and 0, or 130; never an abort
    proc = start(["timeout", "--preserve-status", "12"])
    rc = proc.wait(timeout=120)
    text = log.read_text(errors="replace")
    assert rc in (0, 130), f"timeout: exit {rc}\n{text[-3000:]}"
    assert "terminate called" not in text
    # nothing lost: a third run scores the rest, and every message has a record (the second run
    # was assigned the partition only if its signal came after the model load)
    assigned = _assigned_count(log)
    proc = start([])
    try:
        wait_assigned(proc, assigned + 1)
        deadline = time.monotonic() + 300
        got: set[str] = set()
        while len(got) < len(messages) and time.monotonic() < deadline:
            got = {orjson.loads(r.value)["id"] for r in read_all(t, [t.output], idle_s=1.0)}
        assert got == {m["id"] for m in messages}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


@pytest.mark.real_model
def test_a_sigterm_while_the_model_loads_exits_0_once_loaded_and_consumes_nothing(topics, tmp_path):
    """Not the default action (exit 143): what GNU timeout or a rollout sends to a scorer still loading."""
    t = topics(1)
    produce(t, [json_line({"id": "m0", "text": "a message"})])
    settings = run_settings(t, model="smollm2-135m", pack="spam", metrics_port=0)
    log = tmp_path / "scorer.log"
    proc = _start_scorer(settings, log)
    try:
        deadline = time.monotonic() + 120
        while "loading model" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text(errors="replace")
    assert rc == 0, f"exit {rc}\n{text[-3000:]}"
    assert "SIGTERM before the scorer started" in text and "assigned partitions" not in text, text[-3000:]


# -- the parser guard, on bytes no broker here would store -------------------------------------


def _partition_records(data: bytes, fetch_offset: int = 0):
    """The records aiokafka's fetcher hands out of fetched bytes ``data``, with the guard installed."""
    from aiokafka.consumer import fetcher
    from aiokafka.structs import TopicPartition

    from spinf_stream.stream import fetch_guard

    fetch_guard.install()  # replaces fetcher.MemoryRecords: look it up after this
    records = fetcher.MemoryRecords(data)
    return list(fetcher.PartitionRecords(TopicPartition("t", 0), records, [], fetch_offset, None, None, True, 0))


def _rebase(batch: bytes, base: int) -> bytes:
    return struct.pack(">q", base) + batch[8:]


def _fix_crc(batch: bytearray) -> None:
    """Write the right CRC (crc32c of attributes .. end) into ``batch`` after editing it."""
    from aiokafka.record.util import calc_crc32c

    struct.pack_into(">I", batch, 17, calc_crc32c(bytes(batch[21:])))


@pytest.mark.parametrize("bad", ["crc", "codec", "header_key", "truncated_record"])
def test_the_guard_hands_out_every_offset_of_a_bad_batch_and_moves_past_it(bad):
    from spinf_stream.stream.fetch_guard import UndecodableRecord

    good1 = raw_batch([(None, b'{"text":"a"}', [])])
    recs = [(None, b'{"text":"b"}', []), (None, b'{"text":"c"}', [(b"\xff", b"x")] if bad == "header_key" else []),
            (None, b'{"text":"d"}', [])]
    middle = bytearray(raw_batch(recs, crc=1 if bad == "crc" else None))
    if bad == "codec":  # attributes: compression codec 7 (none such), CRC made right again
        middle[22] = 0x07
        _fix_crc(middle)
    if bad == "truncated_record":  # a record's length runs past the batch, CRC right
        middle[61] = 0x7E  # first record's length varint: 63
        _fix_crc(middle)
    good2 = raw_batch([(None, b'{"text":"e"}', [])])
    data = _rebase(good1, 0) + _rebase(bytes(middle), 1) + _rebase(good2, 4)
    out = _partition_records(data)
    assert [r.offset for r in out] == [0, 1, 2, 3, 4]
    kinds = [isinstance(r, UndecodableRecord) for r in out]
    if bad == "header_key":
        assert kinds == [False, False, True, False, False]
        assert out[1].value == b'{"text":"b"}' and out[3].value == b'{"text":"d"}'
    else:
        assert kinds == [False, True, True, True, False]
    assert out[0].value == b'{"text":"a"}' and out[4].value == b'{"text":"e"}'


# -- a text without visible content ------------------------------------------------------------

INVISIBLE = {
    "Zs": "\u00a0\u2003\u3000",        # no-break, em and ideographic spaces
    "Cf": "\u200b\u200d\u200f\ufeff",  # zero-width space, joiner, bidi mark, BOM inside the text
    "Mn": "\u0301\u0308",              # combining marks with no base
    "Cc": "\u0007\u001b",              # control characters
    "mixed": " \u200b\u0301\t\u00a0\n",
}
VISIBLE = {"e + acute": "e\u0301", "zero-width then x": "\u200bx", "emoji": "\U0001f600", "CJK": "\u4e2d"}


def test_text_without_visible_content_is_empty_field_in_score_and_the_service(tiny_engine, tmp_path):
    import unicodedata

    from spinf_stream.engine import Message
    from spinf_stream.cli.offline import score_file

    for name, text in INVISIBLE.items():  # the definition: every character in Zs, Cf, Mn or Cc after NFC
        assert all(unicodedata.category(c) in {"Zs", "Cf", "Mn", "Cc"} for c in unicodedata.normalize("NFC", text))
    cases = [(f"inv-{k}", v, "empty_field") for k, v in INVISIBLE.items()] + [(f"vis-{k}", v, None) for k, v in VISIBLE.items()]
    got = tiny_engine.prepare([Message(id=i, fields={"text": text}) for i, text, _ in cases])
    for (i, _, kind), item in zip(cases, got):
        err = getattr(item, "error", None)
        assert (err.kind if err is not None else None) == kind, i
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"".join(orjson.dumps({"id": i, "text": text}) + b"\n" for i, text, _ in cases))
    score_file(tiny_engine, str(src), str(dst))
    for (i, _, kind), line in zip(cases, dst.read_bytes().splitlines()):
        rec = orjson.loads(line)
        assert rec["id"] == i and (rec.get("error") or {}).get("kind") == kind, rec
