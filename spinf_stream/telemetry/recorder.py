"""What the scoring service reports, at a few named points: :class:`StreamTelemetry`.

The service calls one method per event (a poll's records read, a batch started and finished, a
record acknowledged, a commit, a rebalance) and hands over a :class:`Sample` of its state every
``--lag-interval-s``; this class turns them into the metrics of :mod:`.metrics`, the spans of a
batch, the health state, and the periodic status line. It knows topics, partitions, offsets,
timestamps and counts, never Kafka clients, tensors, or message content.

Traces (only when a tracer provider exists; otherwise every tracing branch is skipped):

- ``spinf.batch`` (CONSUMER) per engine batch, with a link to each input record's producer span
  (from its ``traceparent`` header; at most :data:`MAX_LINKS` per batch);
- its children ``spinf.forward`` (the engine's forward passes) and ``spinf.produce`` (from the
  end of the forward passes until the broker acknowledged the batch's last record);
- ``spinf.record`` (PRODUCER) per written record, a child of the input record's producer span when
  it had a ``traceparent`` (else of the batch span), linked to its batch; the written record's
  ``traceparent`` header is this span, so the message's trace continues downstream.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from spinf_stream.telemetry import metrics as m
from spinf_stream.telemetry.health import Health
from spinf_stream.telemetry.providers import Providers

log = logging.getLogger("spinf_stream.stream.status")

#: span links per batch span (OpenTelemetry's default span link limit)
MAX_LINKS = 128
TRACE_HEADERS = ("traceparent", "tracestate")

_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """One assigned partition's state. ``lag``: log end offset - committed offset (``None`` when
    unknown); ``oldest_unwritten_ms``: timestamp (ms since the epoch) of the oldest record read but
    not yet acknowledged (``None`` when none is in flight)."""

    topic: str
    partition: int
    lag: int | None
    oldest_unwritten_ms: int | None
    paused: bool


@dataclass(frozen=True, slots=True)
class Sample:
    """The service's state at one moment (plain numbers; see :meth:`StreamTelemetry.observe`)."""

    partitions: tuple[PartitionSample, ...] = ()
    inflight: int = 0
    consumed: int = 0
    scored: int = 0
    dead_lettered: int = 0
    #: records that wait to be written: in flight, plus those the broker holds beyond the last
    #: read of each partition being read (what liveness' "none written" check watches)
    waiting: int = 0
    #: ``(pack, model, messages waiting in its micro-batcher)`` per lane
    queues: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ModelsSample:
    """The models in memory (``(name, bytes counted against the budget or None)``), and the loads
    and evictions so far (plain numbers from the engine pool; see :meth:`StreamTelemetry.watch_models`)."""

    loaded: tuple[tuple[str, int | None], ...] = ()
    loads: int = 0
    evictions: int = 0


@dataclass(frozen=True, slots=True)
class EngineWork:
    """What the engine computed for one batch: ``passes`` forward passes over ``tokens_computed``
    tokens, ``decode_passes`` of them decode steps that wrote ``extracted_tokens`` tokens
    (``None``: the engine does not say)."""

    passes: int | None = None
    tokens_computed: int | None = None
    decode_passes: int | None = None
    extracted_tokens: int | None = None


class BatchTrace:
    """One engine batch as the telemetry sees it (returned by :meth:`StreamTelemetry.batch_started`)."""

    __slots__ = ("span", "produce_span", "pending", "started_ns", "lane")

    def __init__(self, span: Any, started_ns: int, lane: Mapping[str, str] | None = None) -> None:
        self.span = span
        self.produce_span: Any = None
        self.pending = 0  # records of this batch not yet acknowledged (tracing only)
        self.started_ns = started_ns
        self.lane = lane or {}  # its (pack, model) metric attributes


def _carrier(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, str]:
    out = {}
    for k, v in headers or ():
        if k in TRACE_HEADERS and v is not None:
            out[k] = bytes(v).decode("latin-1")
    return out


class HttpRequest:
    """What :meth:`StreamTelemetry.http_request` reports of a request: its ``route`` template
    (``None`` until one matched) and response ``status`` (500 until a response started)."""

    __slots__ = ("method", "route", "status")

    def __init__(self, method: str) -> None:
        self.method, self.route, self.status = method, None, 500


class StreamTelemetry:
    """Metrics, spans, health and the status line of one scoring service.

    One piece (about 310 lines) because it is the one surface the service reports to: each method
    is one named point of the service, translated into every signal at once.

    Args:
        providers: the SDK providers (:func:`~.providers.build_providers`); ``None`` members are off.
        health: the liveness/readiness state the probes read.
        group_id: the consumer group (an attribute of the messaging metrics).
        token_budget: tokens per forward pass (batch fill = batch tokens / budget).
        status_interval_s: seconds between status lines at INFO (0: none).
        lag_interval_s: seconds between :class:`Sample` s the service takes.
    """

    def __init__(
        self,
        providers: Providers | None = None,
        health: Health | None = None,
        *,
        group_id: str = "",
        token_budget: int = 16384,
        status_interval_s: float = 0.0,
        lag_interval_s: float = 5.0,
        clock: Any = time.time,
    ) -> None:
        self.providers = providers or Providers(None, None, None)
        self.health = health or Health()
        self.group_id = group_id
        self.token_budget = token_budget
        self.status_interval_s = status_interval_s
        self.lag_interval_s = lag_interval_s
        self._clock = clock
        mp = self.providers.meter_provider
        meter = (mp or otel_metrics.NoOpMeterProvider()).get_meter("spinf_stream")
        tp = self.providers.tracer_provider
        self._tracer = tp.get_tracer("spinf_stream") if tp is not None else None
        self._sample = Sample()
        self._attrs: dict[tuple[str, int], dict[str, Any]] = {}
        self._topic_attrs: dict[str, dict[str, Any]] = {}
        self._questions = 0
        self._active_requests = 0
        self._status_at = time.monotonic()  # the first status line comes one interval after start
        self._decode_passes = self._extracted = 0  # since start, for the status line
        self._status_last: tuple[int, int, int] = (0, 0, 0)  # questions, scored, dead-lettered
        self._by_pack: Counter[str] = Counter()  # records acknowledged per pack, since start
        self._by_pack_last: Counter[str] = Counter()  # ... at the previous status line
        self._ready_models: dict[str, None] = {}  # models of the scorers ready (without an engine pool)
        self._models: Any = None  # () -> ModelsSample (watch_models)
        self._i = self._instruments(meter)

    @classmethod
    def off(cls) -> StreamTelemetry:
        """No exporter, no tracer: only the health state (the service's default)."""
        return cls()

    @property
    def tracing(self) -> bool:
        return self._tracer is not None

    # -- instruments ------------------------------------------------------------------------------

    def _instruments(self, meter: Any) -> dict[str, Any]:
        observed = {
            "spinf.inflight.records": self._observe_inflight,
            "spinf.partitions.paused": self._observe_paused,
            "spinf.partitions.assigned": self._observe_assigned,
            "spinf.consumer.lag": self._observe_lag,
            "spinf.consumer.time_lag": self._observe_time_lag,
            "spinf.progress.stalled": self._observe_stalled,
            "spinf.queue.depth": self._observe_queues,
            "spinf.models.loaded": self._observe_models_loaded,
            "spinf.model.memory": self._observe_model_memory,
            "http.server.active_requests": self._observe_active_requests,
        }
        observed_counters = {
            "spinf.model.loads": lambda _o: [Observation(self._models_sample().loads)],
            "spinf.model.evictions": lambda _o: [Observation(self._models_sample().evictions)],
        }
        out: dict[str, Any] = {}
        for spec in m.METRICS:
            kw = {"unit": spec.unit, "description": spec.question}
            if spec.name in observed_counters:
                out[spec.name] = meter.create_observable_counter(spec.name, callbacks=[observed_counters[spec.name]], **kw)
            elif spec.kind == "counter":
                out[spec.name] = meter.create_counter(spec.name, **kw)
                if not spec.attributes or spec.name == "spinf.commit.failures":
                    out[spec.name].add(0)  # exported as 0 from the start: rate() works before the first event
            elif spec.kind == "histogram":
                out[spec.name] = meter.create_histogram(
                    spec.name, explicit_bucket_boundaries_advisory=list(spec.buckets or ()), **kw
                )
            elif spec.name in observed:
                out[spec.name] = meter.create_observable_gauge(spec.name, callbacks=[observed[spec.name]], **kw)
            else:
                out[spec.name] = meter.create_gauge(spec.name, **kw)
        return out

    def _partition_attrs(self, topic: str, partition: int) -> dict[str, Any]:
        key = (topic, partition)
        a = self._attrs.get(key)
        if a is None:
            a = self._attrs[key] = {m.SYSTEM: "kafka", m.GROUP: self.group_id, m.TOPIC: topic, m.PARTITION: str(partition)}
        return a

    def _topic(self, topic: str) -> dict[str, Any]:
        a = self._topic_attrs.get(topic)
        if a is None:
            a = self._topic_attrs[topic] = {m.SYSTEM: "kafka", m.GROUP: self.group_id, m.TOPIC: topic}
        return a

    # -- the process ------------------------------------------------------------------------------

    def model_load_time(self, seconds: float) -> None:
        """Loading the model (and pack) took ``seconds`` at start-up."""
        self._i["spinf.model.load.duration"].set(seconds)

    def scorer_ready(self, info: dict[str, str]) -> None:
        """The scorer is loaded: set the constant ``spinf.info`` metric from ``info`` (keys: model,
        pack, pack_version, device, dtype, kernels) and mark the model loaded for readiness."""
        self._i["spinf.info"].set(1, {
            m.MODEL: info.get("model", ""), m.PACK: info.get("pack", ""), m.PACK_VERSION: info.get("pack_version", ""),
            m.DEVICE: info.get("device", ""), m.DTYPE: info.get("dtype", ""), m.KERNELS: info.get("kernels", ""),
            m.TOKEN_BUDGET: info.get("token_budget", str(self.token_budget)),
        })
        lane = {m.PACK: info.get("pack", ""), m.MODEL: info.get("model", "")}
        for name in ("spinf.questions.answered", "spinf.forward.passes", "spinf.decode.passes", "spinf.tokens.extracted",
                     "spinf.tokens.computed", "spinf.tokens.useful"):
            self._i[name].add(0, lane)  # exported as 0 from the start: rate() works before the first batch
        self._ready_models[info.get("model", "")] = None
        self.health.model_loaded()

    def watch_models(self, sample: Any) -> None:
        """Read the models in memory, loads and evictions from ``sample()`` (a
        :class:`ModelsSample`; called at collection time, from the exporter's thread). Without
        it, every scorer made ready counts as one model loaded once."""
        self._models = sample

    def _models_sample(self) -> ModelsSample:
        if self._models is not None:
            try:
                return self._models()
            except RuntimeError:  # the pool changed under the exporter's thread: next time
                pass
        return ModelsSample(tuple((name, None) for name in self._ready_models), len(self._ready_models), 0)

    # -- events from the service ------------------------------------------------------------------

    def consumed(self, topic: str, partition: int, n: int) -> None:
        """``n`` records of ``topic[partition]`` were read."""
        self._i["messaging.client.consumed.messages"].add(n, self._partition_attrs(topic, partition))

    # -- the HTTP API -----------------------------------------------------------------------------

    @contextmanager
    def http_request(self, method: str) -> Iterator[HttpRequest]:
        """One HTTP API request, from its headers read to its response sent: in flight meanwhile,
        then its duration by method, route and status; with a tracer, a server span current
        while it runs (named ``METHOD /route``). Set the yielded request's ``route`` (the matched
        route's template) and ``status``."""
        req = HttpRequest(method)
        self._active_requests += 1
        started = time.perf_counter()
        span = None
        if self._tracer is not None:
            span = self._tracer.start_span(method, kind=SpanKind.SERVER, attributes={m.HTTP_METHOD: method})
        try:
            if span is None:
                yield req
            else:
                with trace.use_span(span, end_on_exit=False):
                    yield req
        finally:
            self._active_requests -= 1
            attrs: dict[str, Any] = {m.HTTP_METHOD: method, m.HTTP_STATUS: req.status}
            if req.route is not None:
                attrs[m.HTTP_ROUTE] = req.route
            self._i["http.server.request.duration"].record(time.perf_counter() - started, attrs)
            if span is not None:
                if req.route is not None:
                    span.update_name(f"{method} {req.route}")
                span.set_attributes(attrs)
                if req.status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                span.end()

    def request_context(self) -> Any:
        """The current HTTP request's span context (to link its batch to), or ``None``."""
        if self._tracer is None:
            return None
        ctx = trace.get_current_span().get_span_context()
        return ctx if ctx.is_valid else None

    def api_batch_started(self, waited_s: Sequence[float], requests: Sequence[Any], *, pack: str = "", model: str = "") -> Any:
        """A batch of API messages of the lane ``pack`` on ``model`` goes to the engine;
        ``waited_s``: each message's time since it was queued; ``requests``: their requests' span
        contexts (:meth:`request_context`). Returns the batch's span (``spinf.api.batch``, linked
        to the requests' spans; ``None`` without a tracer): end it with :meth:`api_batch_finished`."""
        lane = {m.PACK: pack, m.MODEL: model}
        q = self._i["spinf.api.queue.duration"]
        for w in waited_s:
            q.record(w, lane)
        if self._tracer is None:
            return None
        contexts = {c.span_id: c for c in requests if c is not None}  # a request's messages share its span
        links = [Link(c) for c in contexts.values()][:MAX_LINKS]
        return self._tracer.start_span("spinf.api.batch", links=links,
                                       attributes={**lane, "spinf.batch.messages": len(waited_s)})

    def api_batch_finished(self, span: Any) -> None:
        if span is not None:
            span.end()

    def batch_started(
        self, headers: Sequence[Any], waited_s: Sequence[float], tokens: int, *, pack: str = "", model: str = "",
        token_budget: int | None = None,
    ) -> BatchTrace:
        """A batch of ``len(waited_s)`` records (``tokens`` packed tokens) of the lane ``pack`` on
        ``model`` (its budget ``token_budget``, default the service's) goes to the engine;
        ``waited_s``: each record's time since it was read; ``headers``: their Kafka headers
        (read only when tracing)."""
        i = self._i
        n = len(waited_s)
        lane = {m.PACK: pack, m.MODEL: model}
        i["spinf.batch.messages"].record(n, lane)
        i["spinf.batch.tokens"].record(tokens, lane)
        i["spinf.batch.fill"].record(min(1.0, tokens / (token_budget or self.token_budget)), lane)
        q = i["spinf.queue.duration"]
        for w in waited_s:
            q.record(w, lane)
        self.health.engine_busy()
        now = time.time_ns()
        if self._tracer is None:
            return BatchTrace(None, now, lane)
        links = []
        for h in headers:
            if len(links) >= MAX_LINKS:
                break
            carrier = _carrier(h)
            if carrier:
                ctx = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
                if ctx.is_valid:
                    links.append(Link(ctx))
        span = self._tracer.start_span(
            "spinf.batch", kind=SpanKind.CONSUMER, links=links, start_time=now,
            attributes={m.SYSTEM: "kafka", m.GROUP: self.group_id, "messaging.operation.type": "process",
                        "messaging.batch.message_count": n, "spinf.batch.tokens": tokens},
        )
        return BatchTrace(span, now, lane)

    def batch_finished(self, batch: BatchTrace, seconds: float, questions: int, work: EngineWork, useful_tokens: int,
                       written: int) -> None:
        """The engine finished ``batch`` in ``seconds``, answering ``questions``; ``written``:
        records of the batch that will be written (their acknowledgements end its spans)."""
        self.health.engine_idle()
        i = self._i
        lane = batch.lane
        i["spinf.forward.duration"].record(seconds, lane)
        i["spinf.questions.answered"].add(questions, lane)
        self._questions += questions
        if work.passes is not None:
            i["spinf.forward.passes"].add(work.passes, lane)
        if work.decode_passes is not None:
            i["spinf.decode.passes"].add(work.decode_passes, lane)
            self._decode_passes += work.decode_passes
        if work.extracted_tokens is not None:
            i["spinf.tokens.extracted"].add(work.extracted_tokens, lane)
            self._extracted += work.extracted_tokens
        i["spinf.tokens.useful"].add(useful_tokens, lane)
        i["spinf.tokens.computed"].add(work.tokens_computed if work.tokens_computed is not None else useful_tokens, lane)
        if batch.span is None or self._tracer is None:
            return
        end = time.time_ns()
        ctx = trace.set_span_in_context(batch.span)
        fwd = self._tracer.start_span("spinf.forward", context=ctx, start_time=end - int(seconds * 1e9),
                                      attributes={"spinf.forward.passes": work.passes or 0})
        fwd.end(end_time=end)
        batch.pending = written
        batch.produce_span = self._tracer.start_span("spinf.produce", context=ctx, kind=SpanKind.PRODUCER, start_time=end)
        if written == 0:
            self._end_batch(batch)

    def answered(self, counts: Mapping[tuple[str, str, str], int]) -> None:
        """Answers of a finished batch: ``{(pack, question id, answer): n}`` (``spinf.answers``)."""
        counter = self._i["spinf.answers"]
        for (pack, question, answer), n in counts.items():
            counter.add(n, {m.PACK: pack, m.QUESTION: question, m.ANSWER: answer})

    def outgoing_headers(
        self, headers: list[tuple[str, bytes]], input_headers: Any, out_topic: str, batch: BatchTrace | None
    ) -> tuple[list[tuple[str, bytes]], Any]:
        """The headers of a record to write, with ``traceparent`` continuing the input's trace,
        and its ``spinf.record`` span (``None`` when tracing is off: headers unchanged)."""
        if self._tracer is None:
            return headers, None
        carrier = _carrier(input_headers)
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        batch_span = batch.span if batch is not None else None
        links = []
        if parent is None or not trace.get_current_span(parent).get_span_context().is_valid:
            parent = trace.set_span_in_context(batch_span) if batch_span is not None else None
        elif batch_span is not None:
            links.append(Link(batch_span.get_span_context()))
        span = self._tracer.start_span(
            "spinf.record", context=parent, kind=SpanKind.PRODUCER, links=links,
            attributes={m.SYSTEM: "kafka", m.TOPIC: out_topic, "messaging.operation.type": "send"},
        )
        out_carrier: dict[str, str] = {}
        _PROPAGATOR.inject(out_carrier, context=trace.set_span_in_context(span))
        kept = [(k, v) for k, v in headers if k not in TRACE_HEADERS]
        kept.extend((k, v.encode("latin-1")) for k, v in out_carrier.items())
        return kept, span

    def acked(
        self, topic: str, partition: int, timestamp_ms: int | None, read_at: float, error_type: str | None,
        span: Any = None, batch: BatchTrace | None = None, *, pack: str | None = None, model: str | None = None,
    ) -> None:
        """The broker acknowledged a record written for ``topic[partition]`` (a dead letter when
        ``error_type`` is set) for ``pack`` on ``model`` (``None``: a dead letter of a record no
        pack read); ``read_at``: ``time.monotonic()`` when it was read."""
        i = self._i
        lane = {m.PACK: pack, m.MODEL: model} if pack is not None and model is not None else {}
        if pack is not None:
            self._by_pack[pack] += 1
        if error_type is None:
            i["spinf.records.scored"].add(1, {m.TOPIC: topic, m.PARTITION: str(partition), **lane})
        else:
            i["spinf.records.dead_lettered"].add(1, {m.TOPIC: topic, m.ERROR_TYPE: error_type, **lane})
        attrs = self._topic(topic)
        i["messaging.process.duration"].record(time.monotonic() - read_at, attrs)
        if timestamp_ms is not None and timestamp_ms >= 0:
            i["spinf.end_to_end.latency"].record(max(0.0, self._clock() - timestamp_ms / 1000), {m.TOPIC: topic})
        self.health.progress()
        if span is not None:
            span.end()
        if batch is not None and batch.produce_span is not None:
            batch.pending -= 1
            if batch.pending <= 0:
                self._end_batch(batch)

    def _end_batch(self, batch: BatchTrace) -> None:
        if batch.produce_span is not None:
            batch.produce_span.end()
        if batch.span is not None:
            batch.span.end()
        batch.produce_span = batch.span = None

    def committed(self) -> None:
        self._i["spinf.commits"].add(1)

    def commit_failed(self, exc: BaseException) -> None:
        self._i["spinf.commit.failures"].add(1, {m.ERROR_TYPE: type(exc).__name__})

    def rebalanced(self) -> None:
        self._i["spinf.rebalances"].add(1)
        self.health.rebalanced()

    def skipped(self, topic: str, partition: int, offset: int, out_topic: str, exc: BaseException) -> None:
        """The broker refused the record written for ``topic[partition]@offset`` for its size:
        counted, logged, and the input record is treated as done."""
        self._i["spinf.records.skipped"].add(1)
        self.health.progress()
        log.error("skipped %s[%d]@%d: its record for %s was refused for its size (%s)",
                  topic, partition, offset, out_topic, type(exc).__name__)

    def assigned(self, n_partitions: int) -> None:
        self.health.assigned(n_partitions)

    def failed(self, exc: BaseException) -> None:
        self.health.failed(f"{type(exc).__name__}: {exc}"[:300])

    # -- periodic state ---------------------------------------------------------------------------

    def observe(self, sample: Sample) -> None:
        """Take the service's latest state (the gauges read it at collection time) and write the
        status line when one is due."""
        self._sample = sample  # one assignment: the exporter's threads see old or new, never half
        self.health.waiting(sample.waiting)
        self.health.liveness()  # logs a WARNING when a liveness check starts failing
        if self.status_interval_s <= 0:
            return
        now = time.monotonic()
        if now - self._status_at >= self.status_interval_s:
            self._status(sample, now - self._status_at)
            self._status_at, self._status_last = now, (self._questions, sample.scored, sample.dead_lettered)
            self._by_pack_last = Counter(self._by_pack)

    def _status(self, s: Sample, dt: float) -> None:
        q0, sc0, dl0 = self._status_last
        lags = [p.lag for p in s.partitions if p.lag is not None]
        now_ms = self._clock() * 1000
        olds = [p.oldest_unwritten_ms for p in s.partitions if p.oldest_unwritten_ms is not None]
        fields = {
            "consumed": s.consumed, "scored": s.scored, "dead_lettered": s.dead_lettered,
            "inflight": s.inflight, "lag": sum(lags) if lags else None,
            "time_lag_s": round(max(0.0, (now_ms - min(olds)) / 1000), 3) if olds else 0.0,
            "records_per_s": round((s.scored + s.dead_lettered - sc0 - dl0) / dt, 2),
            "questions_per_s": round((self._questions - q0) / dt, 2),
            "partitions": len(s.partitions), "paused": sum(p.paused for p in s.partitions),
            "decode_passes": self._decode_passes, "extracted_tokens": self._extracted,
            "records_per_s_by_pack": {
                pack: round((n - self._by_pack_last[pack]) / dt, 2) for pack, n in sorted(self._by_pack.items())
            },
        }
        extraction = (f", {self._extracted} tokens extracted in {self._decode_passes} decode passes"
                      if self._extracted or self._decode_passes else "")
        by_pack = fields["records_per_s_by_pack"]
        per_pack = (" (" + ", ".join(f"{pack} {rate:.1f}" for pack, rate in by_pack.items()) + ")"
                    if len(by_pack) > 1 else "")
        log.info(
            "status: consumed %d, scored %d, dead-lettered %d, in flight %d, lag %s messages (%.1f s), "
            "%.1f records/s%s, %.1f questions/s%s",
            s.consumed, s.scored, s.dead_lettered, s.inflight, "?" if fields["lag"] is None else fields["lag"],
            fields["time_lag_s"], fields["records_per_s"], per_pack, fields["questions_per_s"], extraction,
            extra=fields,
        )

    def _observe_stalled(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.health.stalled_s())

    def _observe_queues(self, options: CallbackOptions) -> Iterable[Observation]:
        for pack, model, n in self._sample.queues:
            yield Observation(n, {m.PACK: pack, m.MODEL: model})

    def _observe_models_loaded(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(len(self._models_sample().loaded))

    def _observe_model_memory(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, size in self._models_sample().loaded:
            if size is not None:
                yield Observation(size, {m.MODEL: name})

    def _observe_active_requests(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._active_requests)

    def _observe_inflight(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._sample.inflight)

    def _observe_paused(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(sum(p.paused for p in self._sample.partitions))

    def _observe_assigned(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(len(self._sample.partitions))

    def _lag_attrs(self, p: PartitionSample) -> dict[str, Any]:
        return {m.GROUP: self.group_id, m.TOPIC: p.topic, m.PARTITION: str(p.partition)}

    def _observe_lag(self, options: CallbackOptions) -> Iterable[Observation]:
        for p in self._sample.partitions:
            if p.lag is not None:
                yield Observation(p.lag, self._lag_attrs(p))

    def _observe_time_lag(self, options: CallbackOptions) -> Iterable[Observation]:
        now_ms = self._clock() * 1000
        for p in self._sample.partitions:
            age = 0.0 if p.oldest_unwritten_ms is None else max(0.0, (now_ms - p.oldest_unwritten_ms) / 1000)
            yield Observation(age, self._lag_attrs(p))
