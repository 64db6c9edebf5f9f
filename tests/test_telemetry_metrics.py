"""``/metrics`` of a real running service: the embedded broker (Tansu), the real engine on a tiny
random-weight model, real messages from ``../shared/data`` and a few bad ones.

One flow runs per module (read the fixture ``flow``); each test checks one family of metrics
against values computed independently of the telemetry: the produced records' partitions, the
pack's questions, the engine's token counts, the kinds of the bad inputs. The last test runs a
flow of its own with an extraction pack: its decode passes and extracted tokens.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from spinf_stream.models.resolve import resolve
from spinf_stream.packs import load_pack
from spinf_stream.stream.app import load_engine_timed
from spinf_stream.stream.produce import produce_values
from spinf_stream.stream.service import ScoringService
from spinf_stream.stream.topics import ensure_topics
from spinf_stream.telemetry import dashboard
from spinf_stream.telemetry.metrics import METRICS
from broker import (  # noqa: F401  (fixtures)
    FakeScorer,
    RunningService,
    Topics,
    fake_message,
    json_line,
    read_all,
    real_messages,
    run_settings,
    tansu,
    tiny_model,
    topics,
    wait_for,
)
from telemetry_helpers import Scrape, scrape, served
from tiny import EXTRACTION_PACK

pytestmark = pytest.mark.broker

SECRET = "hunter2-correct-horse"
N_GOOD = 30
#: bad inputs and the dead-letter kind each must get (the codec's and the engine's documented kinds)
BAD = [
    (b"{not json", "invalid_json"),
    (b"\xff\xfe", "invalid_utf8"),
    (json_line({"id": "b1"}), "missing_field"),
    (json_line({"id": "b2", "text": "   "}), "empty_field"),
    (json_line({"id": "b3", "text": 5}), "wrong_type"),
]


@dataclass
class Flow:
    topics: Topics
    settings: Any
    metas: list[Any]
    good: list[dict[str, Any]]
    n_bad: int
    before: Scrape  # after the first assignment, before any record
    drained: Scrape  # every record acknowledged and committed, lag sampled at 0
    after_rebalance: Scrape  # a second member joined and left
    batches: int
    useful_tokens: int  # the engine's own token count of the good messages
    answers: Counter[str]  # the spam answers of the good messages' records, scored offline


@pytest.fixture(scope="module")
def flow(tansu, tiny_model) -> Flow:
    tag = uuid.uuid4().hex[:10]
    t = Topics(tansu.bootstrap_servers, f"in-{tag}", f"out-{tag}", f"dlq-{tag}", 3)
    good = real_messages("sms_spam", N_GOOD - 1) + [{"id": SECRET, "text": f"my password is {SECRET}"}]
    values = [json_line(m) for m in good] + [v for v, _ in BAD]
    keys = [m["id"].encode() for m in good] + [f"bad-{i}".encode() for i in range(len(BAD))]
    keys[N_GOOD - 1] = SECRET.encode()
    settings = run_settings(t, model=str(tiny_model), pack="spam", token_budget=4096, lag_interval_s=0.2)

    async def go() -> Flow:
        await ensure_topics(t.kafka, [t.input, t.output, t.dlq], partitions=t.partitions)
        with served(settings) as (telemetry, port):
            engine = load_engine_timed(settings, telemetry)  # the run command's load path
            # every read's tokens: the message's own and those of its views (spam reads views),
            # counted by the engine's prepare, not by the service or its telemetry
            useful = sum(p.n_tokens + sum(v.n_tokens for v in p.views) for p in engine.prepare(_messages(good)))
            answers = Counter(r.scores["spam"].answer for r in engine.score(_messages(good)))
            svc = ScoringService(settings, engine, telemetry=telemetry)
            async with RunningService(svc):
                before = await asyncio.to_thread(scrape, port)
                metas = await produce_values(t.kafka, t.input, values, keys=keys)
                await _api_requests(settings, svc, good[:2])
                await wait_for(lambda: svc.stats.acked >= len(values), timeout_s=300, interval_s=0.1)
                drained = await _when(port, lambda s: s.has("spinf_consumer_lag")
                                      and s.value("spinf_consumer_lag") == 0
                                      and len(s.by("spinf_consumer_lag", "messaging_destination_partition_id")) == 3)
                other = ScoringService(settings, FakeScorer(), make_message=fake_message)
                async with RunningService(other, assign_timeout_s=60):
                    await wait_for(lambda: svc.stats.rebalances >= 1, timeout_s=60)
                after = await asyncio.to_thread(scrape, port)
            return Flow(t, settings, metas, good, len(BAD), before, drained, after, svc.stats.batches, useful, answers)

    return asyncio.run(go())


async def _api_requests(settings: Any, svc: ScoringService, messages: list[dict[str, Any]]) -> None:
    """The HTTP API beside ``svc`` (as ``run`` serves it), answering one request of ``messages``
    (200) and one for a pack not served (404)."""
    import httpx

    from spinf_stream.api.serve import ApiBeside, bind
    from spinf_stream.stream.app import api_lanes

    sock = bind("127.0.0.1", 0)
    api = ApiBeside(settings, api_lanes(settings, svc, None), svc._engine_thread, sock, settings.token_budget,
                    settings.max_batch_messages, settings.too_long, settings.max_prepare_s, telemetry=svc.telemetry)
    await api.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{sock.getsockname()[1]}", timeout=120) as client:
            ok = await client.post("/v1/score", json={"pack": "spam", "messages": messages})
            missing = await client.post("/v1/score", json={"pack": "nope", "messages": messages})
        assert (ok.status_code, missing.status_code) == (200, 404), (ok.text, missing.text)
    finally:
        await api.stop()


def _messages(rows: list[dict[str, Any]]) -> list[Any]:
    from spinf_stream.engine import Message

    return [Message(id=r["id"], fields=r) for r in rows]


async def _when(port: int, ok: Any, timeout_s: float = 30.0) -> Scrape:
    """Scrape until ``ok(scrape)``; the last scrape if it never is (the test's asserts then say why)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        s = await asyncio.to_thread(scrape, port)
        if ok(s) or asyncio.get_running_loop().time() > deadline:
            return s
        await asyncio.sleep(0.2)


def per_partition(metas: list[Any]) -> dict[str, float]:
    return {str(p): float(n) for p, n in Counter(m.partition for m in metas).items()}


# -- counts -------------------------------------------------------------------------------------


def test_consumed_messages_are_counted_per_partition(flow):
    got = flow.drained.by("messaging_client_consumed_messages_total", "messaging_destination_partition_id")
    assert got == per_partition(flow.metas)
    assert flow.drained.value("messaging_client_consumed_messages_total", messaging_system="kafka",
                              messaging_destination_name=flow.topics.input,
                              messaging_consumer_group_name=flow.settings.group_id) == len(flow.metas)


def test_scored_records_are_counted_per_partition(flow):
    got = flow.drained.by("spinf_records_scored_total", "messaging_destination_partition_id")
    assert got == per_partition(flow.metas[:N_GOOD])


def test_dead_letters_are_counted_by_error_type(flow):
    got = flow.drained.by("spinf_records_dead_lettered_total", "error_type")
    assert got == {kind: 1.0 for _, kind in BAD}


def test_questions_answered_are_every_question_of_every_scored_message(flow):
    n_questions = len(load_pack("spam").expand())
    assert flow.drained.value("spinf_questions_answered_total") == N_GOOD * n_questions


def test_answers_are_counted_by_pack_question_and_answer(flow):
    got = flow.drained.by("spinf_answers_total", "spinf_answer")
    assert got == {a: float(n) for a, n in flow.answers.items()} and sum(got.values()) == N_GOOD
    assert flow.drained.value("spinf_answers_total", spinf_pack_name="spam", spinf_question="spam") == N_GOOD
    assert SECRET not in flow.drained.text  # labels are the pack's ids and choices only


def test_batch_histograms_count_every_batch_and_message(flow):
    s = flow.drained
    assert s.value("spinf_batch_messages_count") == flow.batches
    assert s.value("spinf_batch_messages_sum") == N_GOOD  # bad inputs never reach the engine
    assert s.value("spinf_forward_duration_seconds_count") == flow.batches
    assert s.value("spinf_batch_tokens_sum") == flow.useful_tokens
    assert s.value("spinf_batch_fill_count") == flow.batches


def test_token_counters_show_the_padding_of_each_pass_last_row_chunk(flow):
    from spinf_stream.models.torch_backend import ROW_CHUNK

    s = flow.drained
    passes = s.value("spinf_forward_passes_total")
    assert flow.batches <= passes <= N_GOOD
    assert s.value("spinf_tokens_useful_total") == flow.useful_tokens
    # packed without padding between messages; each pass rounded up to whole row chunks
    padding = s.value("spinf_tokens_computed_total") - flow.useful_tokens
    assert 0 <= padding < passes * ROW_CHUNK


def test_latency_histograms_count_every_written_record(flow):
    n = len(flow.metas)
    s = flow.drained
    assert s.value("messaging_process_duration_seconds_count") == n
    assert s.value("spinf_end_to_end_latency_seconds_count") == n
    assert s.value("spinf_queue_duration_seconds_count") == N_GOOD


def test_lag_is_zero_per_partition_once_drained(flow):
    lag = flow.drained.by("spinf_consumer_lag", "messaging_destination_partition_id")
    assert lag == {"0": 0.0, "1": 0.0, "2": 0.0}
    assert set(flow.drained.by("spinf_consumer_time_lag_seconds", "messaging_destination_partition_id").values()) == {0.0}
    assert flow.drained.value("spinf_inflight_records") == 0


def test_commits_and_rebalances_are_counted(flow):
    assert flow.drained.value("spinf_commits_total") >= 1
    assert flow.before.value("spinf_rebalances_total") == 0
    assert flow.after_rebalance.value("spinf_rebalances_total") >= 1


def test_info_names_model_pack_device_dtype_and_budget(flow):
    (labels,) = [lab for n, lab, _ in flow.drained.samples if n == "spinf_info"]
    assert labels["spinf_model"] == resolve(flow.settings.model).name
    assert (labels["spinf_pack_name"], labels["spinf_pack_version"]) == ("spam", load_pack("spam").version)
    assert (labels["spinf_device"], labels["spinf_dtype"], labels["spinf_token_budget"]) == ("cpu", "float32", "4096")
    assert flow.drained.value("spinf_model_load_duration_seconds") > 0


def test_no_content_keys_or_ids_in_metrics(flow):
    assert SECRET not in flow.after_rebalance.text
    for m in flow.good[:5]:
        assert m["id"] not in flow.after_rebalance.text


# -- the dashboard cannot drift from the code -----------------------------------------------------


def test_every_series_the_dashboard_queries_is_exported(flow):
    missing = dashboard.queried_series() - flow.after_rebalance.names()
    assert not missing, f"queried by the dashboard, not exported: {sorted(missing)}"


#: series that records flowing through one member cannot move, and why
STILL_WHEN_FLOWING = {
    "spinf_commit_failures_total": "needs a commit the broker refuses",
    "spinf_decode_passes_total": "moves for packs with extraction questions only (this flow scores spam; see the extraction test below)",
    "spinf_tokens_extracted_total": "moves for packs with extraction questions only (this flow scores spam; see below)",
}


def test_every_counter_and_histogram_the_dashboard_queries_moves_when_records_flow(flow):
    counters = {s for s in dashboard.queried_series() if s.endswith(("_total", "_count", "_sum", "_bucket"))}
    still = [s for s in sorted(counters - set(STILL_WHEN_FLOWING))
             if not flow.after_rebalance.value(s) > flow.before.value(s)]
    assert not still, f"did not move: {still}"


def test_every_defined_metric_is_exported_under_its_prometheus_name(flow):
    names = flow.after_rebalance.names()
    missing = [m.name for m in METRICS if (m.prometheus + ("_count" if m.kind == "histogram" else "")) not in names]
    assert not missing


def test_every_gauge_the_dashboard_queries_has_a_value(flow):
    gauges = {m.prometheus for m in METRICS if m.kind == "gauge"} & dashboard.queried_series()
    assert gauges and all(flow.after_rebalance.has(g) for g in gauges)


def test_the_dashboard_file_is_generated_from_the_metric_definitions():
    assert dashboard.DASHBOARD_FILE.read_text() == dashboard.render(), (
        "deploy/grafana/dashboards/spinf-stream.json is stale: run python -m spinf_stream.telemetry.dashboard"
    )


# -- lag while behind -----------------------------------------------------------------------------


def test_lag_is_positive_while_the_scorer_is_behind_and_paused(topics):
    t = topics(2)
    n = 60
    settings = run_settings(t, max_inflight=6, max_batch_messages=3, window_ms=0, lag_interval_s=0.1)

    async def go() -> tuple[Scrape, dict[int, int], int, ScoringService]:
        with served(settings) as (telemetry, port):
            svc = ScoringService(settings, FakeScorer(delay_s=0.25), make_message=fake_message, telemetry=telemetry)
            async with RunningService(svc):
                metas = await produce_values(t.kafka, t.input, [json_line({"text": f"m{i}"}) for i in range(n)])
                produced = Counter(m.partition for m in metas)
                behind = await _when(port, lambda s: s.value("spinf_partitions_paused") > 0
                                     and len(s.by("spinf_consumer_lag", "messaging_destination_partition_id")) == 2
                                     and s.value("spinf_consumer_time_lag_seconds") > 0)
                acked = svc.stats.acked  # committed offsets never pass acknowledged records
                svc.stop()  # drains the in-flight records only
            return behind, dict(produced), acked, svc

    behind, produced, acked, svc = asyncio.run(go())
    lag = behind.by("spinf_consumer_lag", "messaging_destination_partition_id")
    assert behind.value("spinf_partitions_paused") > 0
    assert all(0 <= lag[str(p)] <= produced[p] for p in produced)
    assert n - acked <= sum(lag.values()) <= n  # lag = end - committed, and committed <= acknowledged
    assert behind.value("spinf_consumer_time_lag_seconds") > 0
    assert behind.value("spinf_inflight_records") <= settings.max_inflight
    assert svc.stats.consumed < n  # it really was behind when scraped


# -- a pack with extraction questions ------------------------------------------------------------


def test_decode_passes_and_extracted_tokens_are_counted_and_on_the_status_line(topics, tiny_model, tmp_path, caplog):
    """Extracted tokens equal the sum of the records' own ``tokens``; each batch takes at least
    its longest extraction's steps less one (its first token is read in the prefill) and at most
    one decode pass per extracted token."""
    pack = tmp_path / "extracting.yaml"
    pack.write_text(EXTRACTION_PACK)
    t = topics(2)
    texts = ["Pay £250 now", "You won $1,000! Call 0800 123 4567", "lunch at 1?", "Send USD 40 to Sam today",
             "Meeting moved to Friday, Ann", "Claim your €500 voucher"]
    values = [json_line({"id": f"x{i}", "text": s}) for i, s in enumerate(texts * 3)]
    settings = run_settings(t, model=str(tiny_model), pack=str(pack), token_budget=4096, status_interval_s=0.2,
                            lag_interval_s=0.1)

    async def go() -> tuple[Scrape, int]:
        await ensure_topics(t.kafka, [t.input, t.output, t.dlq], partitions=t.partitions)
        with served(settings) as (telemetry, port):
            svc = ScoringService(settings, load_engine_timed(settings, telemetry), telemetry=telemetry)
            async with RunningService(svc):
                await produce_values(t.kafka, t.input, values)
                await wait_for(lambda: svc.stats.acked >= len(values), timeout_s=300, interval_s=0.1)
                await asyncio.sleep(0.5)  # one more status line after the last batch
                return await asyncio.to_thread(scrape, port), svc.stats.batches

    with caplog.at_level(logging.INFO, logger="spinf_stream.stream.status"):
        s, batches = asyncio.run(go())
    records = [orjson.loads(r.value) for r in read_all(t, [t.output], len(values))]
    assert len(records) == len(values)
    lengths = [a["tokens"] for r in records for a in r["scores"].values() if "tokens" in a]
    extracted, passes = s.value("spinf_tokens_extracted_total"), s.value("spinf_decode_passes_total")
    assert extracted == sum(lengths) > 0
    assert max(lengths) - 1 <= passes <= sum(lengths)
    assert batches <= s.value("spinf_forward_passes_total") - passes
    status = [r.getMessage() for r in caplog.records if r.getMessage().startswith("status:")]
    assert status and status[-1].endswith(f", {int(extracted)} tokens extracted in {int(passes)} decode passes"), status[-1:]


def test_http_requests_are_measured_by_route_and_status_without_content(flow):
    """The flow's two API requests: one 200 and one 404 on ``/v1/score``, none left in flight, and
    its API messages' queue time; no message text in any label."""
    s = flow.after_rebalance
    base = "http_server_request_duration_seconds_count"
    assert s.value(base, http_route="/v1/score", http_response_status_code="200", http_request_method="POST") == 1
    assert s.value(base, http_route="/v1/score", http_response_status_code="404", http_request_method="POST") == 1
    assert s.value("http_server_active_requests") == 0
    assert s.value("spinf_api_queue_duration_seconds_count") == 2
