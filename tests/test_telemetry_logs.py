"""Logs: ``--log-format json`` (one object per line) and the periodic status line, in the
``run`` command (a real subprocess on the embedded broker, tiny model) and in ``dev``."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import orjson
import pytest

from spinf_stream.config import DevSettings
from spinf_stream.stream.dev import run_dev
from spinf_stream.telemetry.logs import JsonFormatter, configure_logging
from spinf_stream.telemetry.recorder import EngineWork, PartitionSample, Sample, StreamTelemetry
from broker import (  # noqa: F401  (fixtures)
    FakeScorer,
    json_line,
    produce,
    run_settings,
    start_scorer_process,
    tansu,
    tiny_model,
    topics,
    wait_for_log,
)


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), logging.getLogger("spinf_stream").level
    yield
    root.handlers[:] = handlers
    logging.getLogger("spinf_stream").setLevel(level)


def test_a_json_line_has_time_level_logger_message_and_the_extra_fields():
    record = logging.LogRecord("spinf_stream.stream.service", logging.WARNING, __file__, 1,
                               "commit failed on %s", ("p1",), None)
    record.partition = 3
    record.batch_messages = 17
    line = JsonFormatter().format(record)
    obj = orjson.loads(line)
    assert obj.pop("time").endswith("+00:00")
    assert obj == {"level": "WARNING", "logger": "spinf_stream.stream.service", "message": "commit failed on p1",
                   "partition": 3, "batch_messages": 17}
    assert "\n" not in line


def test_json_format_replaces_the_handlers_so_every_line_is_an_object(restore_logging, capsys):
    configure_logging("INFO", "json")
    logging.getLogger("spinf_stream.test").info("hello %d", 5, extra={"offset": 42})
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("spinf_stream.test").exception("failed")
    lines = capsys.readouterr().err.strip().splitlines()
    objs = [orjson.loads(x) for x in lines]
    assert objs[0]["message"] == "hello 5" and objs[0]["offset"] == 42
    assert objs[1]["level"] == "ERROR" and "ValueError: boom" in objs[1]["exception"]


def test_the_status_line_reports_counts_lag_and_rates(caplog):
    now = [1_000_000.0]
    tel = StreamTelemetry(status_interval_s=0.01, clock=lambda: now[0])
    parts = (PartitionSample("in", 0, 7, int((now[0] - 2.5) * 1000), True), PartitionSample("in", 1, 3, None, False))
    with caplog.at_level(logging.INFO, logger="spinf_stream.stream.status"):
        time.sleep(0.02)
        tel.observe(Sample(parts, inflight=4, consumed=30, scored=20, dead_lettered=2))
        tel.observe(Sample(parts, inflight=4, consumed=31, scored=21, dead_lettered=2))  # too soon: no line
    (rec,) = [r for r in caplog.records if r.getMessage().startswith("status:")]
    assert (rec.consumed, rec.scored, rec.dead_lettered, rec.inflight, rec.lag) == (30, 20, 2, 4, 10)
    assert rec.time_lag_s == 2.5 and rec.paused == 1 and rec.partitions == 2
    assert rec.records_per_s > 0 and rec.questions_per_s == 0


def test_the_status_line_gives_records_per_second_per_pack(caplog):
    # 6 spam and 2 moderation records acknowledged in the first interval, 1 spam in the second:
    # each line's rate per pack is that interval's count over its length (the definition).
    tel = StreamTelemetry(status_interval_s=0.05)
    parts = (PartitionSample("in", 0, 0, None, False),)
    rates = []
    with caplog.at_level(logging.INFO, logger="spinf_stream.stream.status"):
        for spam, moderation in ((6, 2), (1, 0)):
            t0 = time.monotonic()
            for pack, n in (("spam", spam), ("moderation", moderation)):
                for _ in range(n):
                    tel.acked("out", 0, None, time.monotonic(), None, pack=pack, model="m")
            time.sleep(0.06)
            start = tel._status_at
            tel.observe(Sample(parts, inflight=0, consumed=8, scored=8, dead_lettered=0))
            rates.append((t0, start, tel._status_at))
    lines = [r for r in caplog.records if r.getMessage().startswith("status:")]
    assert len(lines) == 2
    for rec, (spam, moderation), (_, start, end) in zip(lines, ((6, 2), (1, 0)), rates):
        dt = end - start
        assert rec.records_per_s_by_pack == pytest.approx({"moderation": moderation / dt, "spam": spam / dt}, rel=0.05, abs=0.01)
        assert "records/s (moderation " in rec.getMessage() and ", spam " in rec.getMessage()


def test_the_status_line_counts_decode_passes_and_extracted_tokens(caplog):
    tel = StreamTelemetry(status_interval_s=0.01)
    parts = (PartitionSample("in", 0, 0, None, False),)
    for decode_passes, extracted in ((3, 17), (2, 5)):
        batch = tel.batch_started([None], [0.0], 40)
        tel.batch_finished(batch, 0.1, 4, EngineWork(passes=decode_passes + 1, tokens_computed=128,
                                                     decode_passes=decode_passes, extracted_tokens=extracted), 40, written=1)
    with caplog.at_level(logging.INFO, logger="spinf_stream.stream.status"):
        time.sleep(0.02)
        tel.observe(Sample(parts, inflight=0, consumed=2, scored=2, dead_lettered=0))
    (rec,) = [r for r in caplog.records if r.getMessage().startswith("status:")]
    assert (rec.decode_passes, rec.extracted_tokens) == (5, 22)
    assert rec.getMessage().endswith("22 tokens extracted in 5 decode passes")


@pytest.mark.broker
def test_run_writes_json_status_lines(topics, tiny_model, tmp_path: Path):
    t = topics(2)
    n = 12
    produce(t, [json_line({"id": f"m{i}", "text": f"message {i}"}) for i in range(n)])
    settings = run_settings(t, model=str(tiny_model), pack="spam", token_budget=4096, log_format="json",
                            status_interval_s=0.5, lag_interval_s=0.2)
    log = tmp_path / "run.log"
    proc = start_scorer_process(settings, log)
    try:
        wait_for_log(log, f'"scored":{n},', proc, timeout_s=180)
        wait_for_log(log, '"lag":0,', proc, timeout_s=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    lines = [x for x in log.read_text().splitlines() if x.strip()]
    objs = [orjson.loads(x) for x in lines if x.startswith("{")]
    assert len(objs) >= len(lines) - 2, "json format: log lines must be JSON objects"
    status = [o for o in objs if o["message"].startswith("status:")]
    last = status[-1]
    assert (last["consumed"], last["scored"], last["dead_lettered"], last["lag"]) == (n, n, 0, 0)
    assert {"time", "level", "logger", "questions_per_s", "time_lag_s"} <= set(last)
    assert proc.returncode == 0


@pytest.mark.broker
def test_dev_writes_status_lines(tmp_path: Path, caplog, restore_logging):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(json_line({"id": f"m{i}", "text": f"t{i}"}) + b"\n" for i in range(6)))
    settings = DevSettings.model_validate({
        "port": 0, "input": str(src), "until_done": True, "print": "none", "metrics_port": 0,
        "status_interval_s": 0.2, "lag_interval_s": 0.1, "max_batch_messages": 1, "api_port": 0,
    })
    with caplog.at_level(logging.INFO, logger="spinf_stream"):
        code = run_dev(settings, scorer=FakeScorer(delay_s=0.3))
    assert code == 0
    assert any(r.getMessage().startswith("status: consumed") for r in caplog.records), caplog.text[-2000:]
