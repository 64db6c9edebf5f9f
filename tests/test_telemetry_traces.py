"""Traces: batch → forward → produce spans linked to the producers' spans, the written records'
``traceparent`` continuing each message's trace; and the OTLP exporters chosen by the standard
``OTEL_*`` variables, checked against a real HTTP receiver that decodes what it gets."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_span_id, format_trace_id, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from spinf_stream.stream.service import ScoringService
from spinf_stream.telemetry import create_telemetry
from spinf_stream.telemetry.providers import TelemetryConfigError, build_providers
from broker import (  # noqa: F401  (fixtures)
    FakeScorer,
    RunningService,
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


def producer_headers(tracer: Any, n: int) -> tuple[list[list[tuple[str, bytes]]], list[Any]]:
    """``n`` producer spans (as a producing application would make them) and their headers."""
    headers, contexts = [], []
    for i in range(n):
        span = tracer.start_span(f"send {i}")
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(span))
        span.end()
        headers.append([(k, v.encode()) for k, v in carrier.items()])
        contexts.append(span.get_span_context())
    return headers, contexts


def parse_traceparent(value: bytes) -> tuple[str, str]:
    _, trace_id, span_id, _ = value.decode().split("-")
    return trace_id, span_id


@pytest.mark.broker
def test_a_batch_span_has_forward_and_produce_children_links_to_producers_and_the_output_continues_each_trace(topics):
    t = topics(1)
    producer_side = TracerProvider()
    producer_side.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    headers, producers = producer_headers(producer_side.get_tracer("app"), 3)
    values = [json_line({"id": f"m{i}", "text": f"message {i}"}) for i in range(3)]
    values += [json_line({"id": "plain", "text": "no trace context"}), b"not json"]
    headers += [[], headers[0]]  # a message without traceparent; a bad one in m0's trace
    exporter = InMemorySpanExporter()
    settings = run_settings(t, window_ms=300)

    async def go() -> None:
        telemetry = create_telemetry(settings, span_exporter=exporter, environ={})
        svc = ScoringService(settings, FakeScorer(), make_message=fake_message, telemetry=telemetry)
        async with RunningService(svc):
            await asyncio.to_thread(produce, t, values, None, headers)
            await wait_for(lambda: svc.stats.acked >= len(values))

    asyncio.run(go())
    spans = exporter.get_finished_spans()
    batches = {s.context.span_id: s for s in spans if s.name == "spinf.batch"}
    assert batches
    for name in ("spinf.forward", "spinf.produce"):
        children = [s for s in spans if s.name == name]
        assert len(children) == len(batches)
        for c in children:
            assert c.parent is not None and c.parent.span_id in batches
            assert c.context.trace_id == batches[c.parent.span_id].context.trace_id
    linked = {(ln.context.trace_id, ln.context.span_id) for b in batches.values() for ln in b.links}
    assert linked == {(p.trace_id, p.span_id) for p in producers}

    records = {s.context.span_id: s for s in spans if s.name == "spinf.record"}
    out = read_all(t, [t.output, t.dlq], n=len(values))
    assert len(out) == len(values)
    for rec in out:
        offset = source_of(rec)[2]
        trace_id, span_id = parse_traceparent(dict(rec.headers)["traceparent"])
        span = records[int(span_id, 16)]  # the record's traceparent is its spinf.record span
        if offset < 3 or offset == 4:  # the message had a producer span: its trace goes on
            parent = producers[offset if offset < 3 else 0]
            assert trace_id == format_trace_id(parent.trace_id)
            assert span.parent is not None and format_span_id(span.parent.span_id) == format_span_id(parent.span_id)
        else:  # no trace context in: the record continues the batch's trace
            assert span.parent is not None and span.parent.span_id in batches
    bodies = [orjson.loads(r.value) for r in out]
    assert {b.get("id") for b in bodies} >= {"m0", "m1", "m2", "plain"}


@pytest.mark.broker
def test_without_an_exporter_there_is_no_tracer_and_traceparent_passes_through(topics):
    t = topics(1)
    tp = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    settings = run_settings(t)

    async def go() -> bool:
        telemetry = create_telemetry(settings, environ={})
        svc = ScoringService(settings, FakeScorer(), make_message=fake_message, telemetry=telemetry)
        async with RunningService(svc):
            await asyncio.to_thread(produce, t, [json_line({"text": "hi"})], None, [[("traceparent", tp)]])
            await wait_for(lambda: svc.stats.acked >= 1)
        return telemetry.tracing

    assert asyncio.run(go()) is False
    (rec,) = read_all(t, [t.output], n=1)
    assert dict(rec.headers)["traceparent"] == tp


# -- OTLP push from the standard variables ---------------------------------------------------------


class Receiver:
    """An OTLP/HTTP receiver on a free loopback port: keeps every POST body by path."""

    def __init__(self) -> None:
        self.bodies: dict[str, list[bytes]] = {}
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.setdefault(self.path, []).append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}"

    def close(self) -> None:
        self.httpd.shutdown()


def test_otlp_endpoint_variable_pushes_metrics_and_traces_over_http_protobuf():
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    rx = Receiver()
    try:
        providers = build_providers(prometheus=False, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint})
        assert providers.meter_provider is not None and providers.tracer_provider is not None
        meter = providers.meter_provider.get_meter("t")
        meter.create_counter("spinf.records.scored").add(3)
        providers.tracer_provider.get_tracer("t").start_span("spinf.batch").end()
        providers.shutdown()  # flushes both exporters
    finally:
        rx.close()
    traces = ExportTraceServiceRequest.FromString(rx.bodies["/v1/traces"][0])
    names = [s.name for r in traces.resource_spans for ss in r.scope_spans for s in ss.spans]
    assert names == ["spinf.batch"]
    resource = {a.key: a.value.string_value for a in traces.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "spinf-stream"
    metrics = ExportMetricsServiceRequest.FromString(rx.bodies["/v1/metrics"][-1])
    points = {m.name: m.sum.data_points[0].as_int for r in metrics.resource_metrics for sm in r.scope_metrics for m in sm.metrics}
    assert points == {"spinf.records.scored": 3}


def test_nothing_is_pushed_without_the_variables_or_with_exporter_none():
    off = build_providers(prometheus=False, environ={})
    assert (off.meter_provider, off.tracer_provider) == (None, None)
    none = build_providers(prometheus=False, environ={
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
    })
    assert (none.meter_provider, none.tracer_provider) == (None, None)


def test_an_otlp_protocol_other_than_http_protobuf_is_refused_by_name():
    with pytest.raises(TelemetryConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL='grpc'"):
        build_providers(prometheus=False, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_an_api_request_has_a_server_span_and_its_batch_span_links_to_it():
    """Two requests sharing one batch: each a ``POST /v1/score`` server span with its route and
    status, and one ``spinf.api.batch`` span linked to both; a 404 is a span too, with no batch."""
    import concurrent.futures

    import httpx
    from test_api import serving

    from spinf_stream.config import RunSettings

    exporter = InMemorySpanExporter()
    telemetry = create_telemetry(RunSettings.model_validate({"metrics_port": 0}), span_exporter=exporter, environ={})
    with serving(telemetry=telemetry, window_s=0.3) as s:
        def post(body: dict[str, Any]) -> int:
            return httpx.post(f"{s.url}/v1/score", json=body, timeout=30).status_code

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            codes = list(pool.map(post, [{"pack": "spam", "messages": [{"text": f"m{i}"}]} for i in range(2)]))
        assert codes == [200, 200] and post({"pack": "nope", "messages": [{"text": "x"}]}) == 404
    telemetry.providers.shutdown()
    spans = exporter.get_finished_spans()
    requests = [x for x in spans if x.name == "POST /v1/score"]
    assert sorted(x.attributes["http.response.status_code"] for x in requests) == [200, 200, 404]
    assert all(x.attributes["http.route"] == "/v1/score" and x.kind.name == "SERVER" for x in requests)
    (batch,) = [x for x in spans if x.name == "spinf.api.batch"]
    ok = {x.context.span_id for x in requests if x.attributes["http.response.status_code"] == 200}
    assert {link.context.span_id for link in batch.links} == ok


def test_a_model_read_request_has_its_engine_calls_batch_span_linked_to_it(tiny_models, loaded):
    """``/v1/completions`` and ``/v1/score`` (SGLang's shape) read the model without a pack: each
    request's engine call is a ``spinf.api.batch`` span of the model, linked to that request's
    server span, and its prompts' queue time is recorded."""
    import httpx
    from test_api import serving

    from spinf_stream.config import RunSettings
    from spinf_stream.engine import Engine
    from spinf_stream.packs import load_pack

    exporter = InMemorySpanExporter()
    telemetry = create_telemetry(RunSettings.model_validate({"metrics_port": 0}), span_exporter=exporter, environ={})
    decoder, tok = loaded(tiny_models("llama"))
    with serving({"auto": Engine(decoder, tok, load_pack("spam"), "llama")}, telemetry=telemetry) as s:
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": ["a b", "a c"], "max_tokens": 3}, timeout=60)
        assert r.status_code == 200, r.text
        r = httpx.post(f"{s.url}/v1/score", json={"query": "q", "items": ["a"], "label_token_ids": [1]}, timeout=60)
        assert r.status_code == 200, r.text
    telemetry.providers.shutdown()
    spans = exporter.get_finished_spans()
    for route in ("/v1/completions", "/v1/score"):
        (request,) = [x for x in spans if x.name == f"POST {route}"]
        (batch,) = [x for x in spans if x.name == "spinf.api.batch"
                    and [link.context.span_id for link in x.links] == [request.context.span_id]]
        assert batch.attributes["spinf.model"] == "llama" and request.start_time <= batch.start_time <= batch.end_time <= request.end_time
    assert [x.attributes["spinf.batch.messages"] for x in spans if x.name == "spinf.api.batch"] == [2, 1]


@pytest.mark.parametrize("broken", ["api_batch_started", "api_batch_finished"])
def test_a_telemetry_hook_that_raises_is_logged_and_the_requests_are_still_answered(broken, monkeypatch, caplog):
    """A broken exporter must not stop the API's batch loop: each request is answered as usual,
    the next one too, and the exception is logged naming the hook."""
    import httpx
    from test_api import serving

    from spinf_stream.config import RunSettings

    telemetry = create_telemetry(RunSettings.model_validate({"metrics_port": 0}), span_exporter=InMemorySpanExporter(), environ={})

    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("exporter down")

    monkeypatch.setattr(telemetry, broken, boom)
    with caplog.at_level("ERROR", logger="spinf_stream.api.scoring"), serving(telemetry=telemetry) as s:
        for i in range(2):
            r = httpx.post(f"{s.url}/v1/score", json={"pack": "spam", "messages": [{"text": f"m{i}"}]}, timeout=30)
            assert r.status_code == 200 and "scores" in r.json()["records"][0], r.text
    telemetry.providers.shutdown()
    assert sum(f"API telemetry failed in {broken}" in rec.getMessage() for rec in caplog.records) == 2
