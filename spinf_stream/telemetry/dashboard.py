"""The Grafana dashboard, generated from :mod:`.metrics`: ``deploy/grafana/dashboards/spinf-stream.json``.

Every panel's queries are built from :class:`Query` values that name their metric by its
:class:`~.metrics.MetricSpec`, so a renamed or removed metric breaks the build of the dashboard, not
the dashboard in production. A test regenerates the file and compares, and another scrapes a
running service and checks that each series queried here is exported and moves.

    python -m spinf_stream.telemetry.dashboard [OUT.json]   # rewrite the dashboard file

A query is one of a few PromQL shapes (:class:`Query`), so that ``bench/dashboard_plot.py`` can
evaluate the same queries on scraped samples and plot what each panel shows without Grafana.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from spinf_stream.telemetry import metrics as m
from spinf_stream.telemetry.metrics import BY_NAME, MetricSpec, prometheus_label

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_FILE = REPO / "deploy" / "grafana" / "dashboards" / "spinf-stream.json"
DATASOURCE_UID = "spinf-prometheus"  # the provisioned Prometheus data source (deploy/grafana/provisioning)
RATE_WINDOW = "$__rate_interval"

Shape = Literal["rate", "increase", "quantile", "gauge", "mean", "ratio", "one_minus_ratio"]


@dataclass(frozen=True)
class Query:
    """One panel query.

    Shapes (``by``: Prometheus labels to keep; ``sum`` over the rest, i.e. over replicas):

    - ``rate``: per-second rate of a counter; ``increase``: its increase over the window;
    - ``quantile``: ``histogram_quantile(q, ...)`` of a histogram;
    - ``gauge``: a gauge's value (``agg`` = ``sum`` or ``max``);
    - ``mean``: a histogram's mean over the window (``rate(_sum) / rate(_count)``);
    - ``ratio`` / ``one_minus_ratio``: ``rate(metric) / rate(other)`` (or 1 minus it), two counters.
    """

    shape: Shape
    metric: str  # OTel name (a key of metrics.BY_NAME)
    legend: str
    by: tuple[str, ...] = ()  # OTel attribute keys
    q: float | None = None
    other: str | None = None
    agg: Literal["sum", "max"] = "sum"

    def __post_init__(self) -> None:
        for name in (self.metric, self.other):
            if name is not None and name not in BY_NAME:
                raise KeyError(f"dashboard query on an undefined metric {name!r}")

    @property
    def spec(self) -> MetricSpec:
        return BY_NAME[self.metric]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(prometheus_label(a) for a in self.by)

    def series(self) -> list[str]:
        """The Prometheus series names this query reads."""
        base = self.spec.prometheus
        if self.shape in ("rate", "increase") and self.spec.kind == "histogram":
            return [base + "_count"]  # a histogram's rate: its observations per second
        if self.shape == "quantile":
            return [base + "_bucket"]
        if self.shape == "mean":
            return [base + "_sum", base + "_count"]
        if self.other is not None:
            return [base, BY_NAME[self.other].prometheus]
        return [base]

    @property
    def selector(self) -> str:
        """The pack/model selector (the dashboard's ``$pack`` and ``$model`` variables) on a metric
        with those attributes; empty on the others."""
        return _LANE_SELECTOR if {m.PACK, m.MODEL} <= set(self.spec.attributes) else ""

    @property
    def promql(self) -> str:
        base = self.spec.prometheus + ("_count" if self.shape in ("rate", "increase") and self.spec.kind == "histogram" else "")
        by = f" by ({', '.join(self.labels)})" if self.labels else ""
        sel = self.selector
        if self.shape == "rate":
            return f"sum{by} (rate({base}{sel}[{RATE_WINDOW}]))"
        if self.shape == "increase":
            return f"sum{by} (increase({base}{sel}[{RATE_WINDOW}]))"
        if self.shape == "quantile":
            keep = ", ".join(("le", *self.labels))
            return f"histogram_quantile({self.q}, sum by ({keep}) (rate({base}_bucket{sel}[{RATE_WINDOW}])))"
        if self.shape == "gauge":
            return f"{self.agg}{by} ({base}{sel})"
        if self.shape == "mean":
            return f"sum{by} (rate({base}_sum{sel}[{RATE_WINDOW}])) / sum{by} (rate({base}_count{sel}[{RATE_WINDOW}]))"
        other = BY_NAME[self.other or ""].prometheus
        ratio = f"sum{by} (rate({base}{sel}[{RATE_WINDOW}])) / sum{by} (rate({other}{sel}[{RATE_WINDOW}]))"
        return ratio if self.shape == "ratio" else f"1 - {ratio}"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # Grafana unit id: reqps, s, short, percentunit, none
    queries: tuple[Query, ...]
    description: str = ""
    width: int = 12
    extra: dict[str, Any] = field(default_factory=dict)


def _q(metric: str, shape: Shape, legend: str, **kw: Any) -> Query:
    return Query(shape, metric, legend, **kw)


PART = (m.TOPIC, m.PARTITION)
LANE = (m.PACK, m.MODEL)
_LANE_SELECTOR = '{spinf_pack_name=~"$pack", spinf_model=~"$model"}'


def _variable(name: str, label: str) -> dict[str, Any]:
    """A dashboard variable: every value of ``label`` on ``spinf_info`` (multi-select, All by default)."""
    return {
        "name": name, "label": name, "type": "query", "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
        "query": {"query": f"label_values(spinf_info, {label})", "refId": name},
        "definition": f"label_values(spinf_info, {label})", "refresh": 2, "includeAll": True, "multi": True,
        "allValue": ".*", "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "sort": 1,
    }

PANELS: tuple[Panel, ...] = (
    Panel("Throughput", "reqps", (
        _q("messaging.client.consumed.messages", "rate", "consumed"),
        _q("spinf.records.scored", "rate", "scored"),
        _q("spinf.records.dead_lettered", "rate", "dead-lettered"),
    ), "Records per second read, scored and dead-lettered (acknowledged by the broker), all replicas."),
    Panel("Questions answered", "short", (
        _q("spinf.questions.answered", "rate", "questions/s"),
    ), "The engine's output: questions answered per second."),
    Panel("Answers per question", "short", (
        _q("spinf.answers", "rate", "{{spinf_pack_name}} {{spinf_question}} = {{spinf_answer}}",
           by=(m.PACK, m.QUESTION, m.ANSWER)),
    ), "Answers per second by question and answer (a choice, or value/none for an extraction). A rate that moves "
       "while the pack, the model and the input rate stay the same is drift in what the messages say.", 24),
    Panel("Consumer lag (messages)", "short", (
        _q("spinf.consumer.lag", "gauge", "{{messaging_destination_name}}[{{messaging_destination_partition_id}}]",
           by=PART, agg="max"),
    ), "Log end offset - committed offset, per partition. Keeps growing: add replicas (up to the partition count)."),
    Panel("Time lag", "s", (
        _q("spinf.consumer.time_lag", "gauge", "{{messaging_destination_name}}[{{messaging_destination_partition_id}}]",
           by=PART, agg="max"),
    ), "Now - timestamp of the oldest record read but not yet written, per partition."),
    Panel("End-to-end latency", "s", (
        _q("spinf.end_to_end.latency", "quantile", "p50", q=0.5),
        _q("spinf.end_to_end.latency", "quantile", "p95", q=0.95),
        _q("spinf.end_to_end.latency", "quantile", "p99", q=0.99),
    ), "Record timestamp to the acknowledgement of its score."),
    Panel("Processing and queue time", "s", (
        _q("messaging.process.duration", "quantile", "read→ack p50", q=0.5),
        _q("messaging.process.duration", "quantile", "read→ack p99", q=0.99),
        _q("spinf.queue.duration", "quantile", "queue p95", q=0.95),
    ), "Read to acknowledgement, and read to the start of its batch on the engine."),
    Panel("Forward pass time per batch", "s", (
        _q("spinf.forward.duration", "quantile", "p50", q=0.5),
        _q("spinf.forward.duration", "quantile", "p95", q=0.95),
        _q("spinf.forward.duration", "mean", "mean"),
    ), "The engine's forward passes for one batch (GPU or CPU time, wall clock)."),
    Panel("Batch fill", "percentunit", (
        _q("spinf.batch.fill", "mean", "tokens / budget (mean)"),
        _q("spinf.batch.fill", "quantile", "p10", q=0.1),
    ), "Share of the token budget a batch uses; low fill under load: raise --window-ms."),
    Panel("Batch size", "short", (
        _q("spinf.batch.messages", "mean", "messages/batch"),
        _q("spinf.batch.tokens", "mean", "tokens/batch"),
        _q("spinf.tokens.computed", "ratio", "tokens/pass", other="spinf.forward.passes"),
    )),
    Panel("Padding and recomputation", "percentunit", (
        _q("spinf.tokens.useful", "one_minus_ratio", "share of computed tokens not needed", other="spinf.tokens.computed"),
    ), "1 - useful tokens / computed tokens."),
    Panel("Extraction: decode passes and extracted tokens", "short", (
        _q("spinf.decode.passes", "rate", "decode passes/s"),
        _q("spinf.tokens.extracted", "rate", "extracted tokens/s"),
        _q("spinf.forward.passes", "rate", "forward passes/s (all)"),
    ), "Packs with extraction questions: the decode steps' passes (one per step of a batch, over all its open "
       "extractions) and the tokens they wrote."),
    Panel("Dead letters by error.type", "reqps", (
        _q("spinf.records.dead_lettered", "rate", "{{error_type}}", by=(m.ERROR_TYPE,)),
    ), "Records per second sent to the dead-letter topic, by reason."),
    Panel("In flight and paused", "short", (
        _q("spinf.inflight.records", "gauge", "records in flight"),
        _q("spinf.partitions.paused", "gauge", "paused partitions"),
        _q("spinf.partitions.assigned", "gauge", "assigned partitions"),
    ), "Backpressure pauses partitions when in-flight records reach --max-inflight."),
    Panel("Rebalances and commits", "short", (
        _q("spinf.rebalances", "increase", "rebalances"),
        _q("spinf.commits", "increase", "commits"),
        _q("spinf.commit.failures", "increase", "commit failures"),
    ), "Per rate window, all replicas."),
    Panel("Queue depth per pack and model", "short", (
        _q("spinf.queue.depth", "gauge", "{{spinf_pack_name}} on {{spinf_model}}", by=LANE),
    ), "Prepared messages waiting in each (pack, model)'s micro-batcher for the engine (--routes: one lane each)."),
    Panel("Models in memory", "short", (
        _q("spinf.models.loaded", "gauge", "models loaded", agg="max"),
    ), "--routes: models load on demand and the least recently used is evicted under --model-memory-budget "
       "(spinf_model_memory_bytes, spinf_model_loads_total, spinf_model_evictions_total say how much and how often)."),
    Panel("Model load time", "s", (
        _q("spinf.model.load.duration", "gauge", "load time", agg="max"),
        _q("spinf.info", "gauge", "{{spinf_model}} {{spinf_pack_name}}@{{spinf_pack_version}} {{spinf_device}} {{spinf_dtype}}",
           by=(m.MODEL, m.PACK, m.PACK_VERSION, m.DEVICE, m.DTYPE, m.KERNELS), agg="max"),
    ), "Start-up load time; the legend names what each replica runs."),
    Panel("HTTP API requests", "reqps", (
        _q("http.server.request.duration", "rate", "{{http_request_method}} {{http_route}} {{http_response_status_code}}",
           by=(m.HTTP_METHOD, m.HTTP_ROUTE, m.HTTP_STATUS)),
        _q("http.server.active_requests", "gauge", "in flight"),
    ), "Requests per second by route and status (429: the queue was full; 504: over --api-timeout-s), and in flight."),
    Panel("HTTP API latency", "s", (
        _q("http.server.request.duration", "quantile", "{{http_route}} p50", q=0.5, by=(m.HTTP_ROUTE,)),
        _q("http.server.request.duration", "quantile", "{{http_route}} p99", q=0.99, by=(m.HTTP_ROUTE,)),
        _q("spinf.api.queue.duration", "quantile", "queue p95", q=0.95),
    ), "Request duration, and an API message's wait for its batch (the latency window and stream batches ahead of it)."),
)


def queried_series() -> set[str]:
    """Every Prometheus series name the dashboard reads."""
    return {s for p in PANELS for q in p.queries for s in q.series()}


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard JSON model (schema version 39)."""
    panels = []
    x = y = 0
    for i, p in enumerate(PANELS):
        if x + p.width > 24:
            x, y = 0, y + 8
        panels.append({
            "id": i + 1,
            "type": "timeseries",
            "title": p.title,
            "description": p.description,
            "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
            "gridPos": {"x": x, "y": y, "w": p.width, "h": 8},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "none"}},
            "targets": [
                {"refId": chr(ord("A") + k), "expr": q.promql, "legendFormat": q.legend,
                 "datasource": {"type": "prometheus", "uid": DATASOURCE_UID}}
                for k, q in enumerate(p.queries)
            ],
        })
        x += p.width
    return {
        "uid": "spinf-stream",
        "title": "spinf-stream",
        "description": "Kafka scorer: throughput, lag, latency, batches, dead letters (generated by "
                       "python -m spinf_stream.telemetry.dashboard from spinf_stream/telemetry/metrics.py)",
        "tags": ["spinf-stream", "kafka"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "panels": panels,
        "templating": {"list": [_variable("pack", "spinf_pack_name"), _variable("model", "spinf_model")]},
        "annotations": {"list": []},
    }


def render() -> str:
    """The dashboard file's text (indent 2, trailing newline)."""
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def write(path: Path = DASHBOARD_FILE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(), encoding="utf-8")
    return path


if __name__ == "__main__":  # python -m spinf_stream.telemetry.dashboard [OUT.json]
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else DASHBOARD_FILE))
