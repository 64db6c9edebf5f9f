"""Every metric the scorer exports, in one place.

Name, kind, unit, attributes, buckets, and the
question it answers.

The recorder (:mod:`spinf_stream.telemetry.recorder`) creates its instruments from :data:`METRICS`
and nothing else; the Grafana dashboard (:mod:`spinf_stream.telemetry.dashboard`) queries them
through :func:`prometheus_name`, and a test scrapes a running service to check that every series
the dashboard asks for is exported and moves. Add a metric here first.

Names follow the OpenTelemetry semantic conventions for messaging where one fits
(``messaging.client.consumed.messages``, ``messaging.process.duration``, the ``messaging.*`` and
``error.type`` attributes; semconv 1.30+); the rest are ours, under ``spinf.``.

Units are UCUM, as OpenTelemetry asks: durations in seconds (``s``, the semantic conventions'
and Prometheus' base unit) with bucket boundaries from 1 ms up, sizes in ``{token}`` or
``{message}``. The Prometheus exporter turns ``spinf.forward.duration`` (unit ``s``) into
``spinf_forward_duration_seconds`` and a counter ``spinf.records.scored`` into
``spinf_records_scored_total`` (OpenTelemetry's Prometheus compatibility rules).

Attribute values never carry message content, keys or ids: only topics, partitions, consumer
group, error kinds, the scorer's own configuration and the pack's question ids and choice labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

# -- attribute names (OpenTelemetry semantic conventions for messaging) -------------------------

SYSTEM = "messaging.system"  # always "kafka"
GROUP = "messaging.consumer.group.name"
TOPIC = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"  # a string, as the conventions say
ERROR_TYPE = "error.type"  # the dead-letter kind, or an exception's class name

# -- HTTP server (semantic conventions for HTTP) ------------------------------------------------

HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"  # the route's template, e.g. /v1/score; absent when no route matched
HTTP_STATUS = "http.response.status_code"

# -- ours ---------------------------------------------------------------------------------------

MODEL = "spinf.model"
PACK = "spinf.pack.name"
PACK_VERSION = "spinf.pack.version"
DEVICE = "spinf.device"
DTYPE = "spinf.dtype"
KERNELS = "spinf.kernels"
TOKEN_BUDGET = "spinf.token_budget"
QUESTION = "spinf.question"  # a question id of the pack
ANSWER = "spinf.answer"  # a choice label of the pack, or "value"/"none" for an extraction

Kind = Literal["counter", "histogram", "gauge"]

#: seconds, 1 ms to 10 min: latencies of a batch, a forward pass, a record end to end
LATENCY_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: tokens, 16 to 128k (the token budget is 16,384 by default)
TOKENS = tuple(float(2**k) for k in range(4, 18))
#: messages per batch, 1 to 4096 (the message cap is 512 by default)
MESSAGES = tuple(float(2**k) for k in range(0, 13))
#: a share, 0 to 1
SHARE = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: what the recorder creates and what the dashboard queries.

    ``name`` and ``unit`` are OpenTelemetry's (UCUM unit, ``{annotation}`` for counts);
    ``attributes`` the attribute keys its points carry (some only on some points, e.g.
    ``error.type``); ``buckets`` the explicit histogram boundaries (histograms only);
    ``question`` what a person running the service learns from it (its description).
    """

    name: str
    kind: Kind
    unit: str
    question: str
    attributes: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    @property
    def prometheus(self) -> str:
        """The exported Prometheus name (see :func:`prometheus_name`)."""
        return prometheus_name(self)


_MSG = (SYSTEM, GROUP, TOPIC, PARTITION)
#: the (pack, model) lane a batch or record belongs to (``--routes``: several per service)
_LANE = (PACK, MODEL)

METRICS: tuple[MetricSpec, ...] = (
    # -- messaging (semantic conventions) --
    MetricSpec(
        "messaging.client.consumed.messages", "counter", "{message}",
        "How many records has this member read, per topic and partition? (rate: consumption speed)",
        _MSG,
    ),
    MetricSpec(
        "messaging.process.duration", "histogram", "s",
        "How long does a record take from being read to its score or dead-letter record being acknowledged?",
        (SYSTEM, GROUP, TOPIC), LATENCY_S,
    ),
    # -- outcomes --
    MetricSpec(
        "spinf.records.scored", "counter", "{record}",
        "How many score records were written and acknowledged, per input topic and partition, pack and model? "
        "(rate: throughput)",
        (TOPIC, PARTITION, *_LANE),
    ),
    MetricSpec(
        "spinf.records.dead_lettered", "counter", "{record}",
        "What goes to the dead-letter topic, and why? (by error.type: invalid_json, too_long, engine_error, ...; "
        "pack and model when the dead letter is for one pack)",
        (TOPIC, ERROR_TYPE, *_LANE),
    ),
    MetricSpec(
        "spinf.records.skipped", "counter", "{record}",
        "How many written records did the broker refuse for their size even so (reported with topic, partition "
        "and offset, then skipped: nothing else can be done with them)?",
    ),
    MetricSpec(
        "spinf.questions.answered", "counter", "{question}",
        "How many questions has the engine answered? (rate: questions per second, the engine's real output)",
        _LANE,
    ),
    MetricSpec(
        "spinf.answers", "counter", "{answer}",
        "What does the pack answer, per question and answer (a choice label; value or none for an extraction)? "
        "A rate that moves with no change of pack or model is drift in the input. Labels are the pack's own ids "
        "and choices, never message content.",
        (PACK, QUESTION, ANSWER),
    ),
    # -- batches and the engine --
    MetricSpec(
        "spinf.batch.messages", "histogram", "{message}",
        "How many messages does a batch hold (is the batcher filling batches or closing them on the window)?",
        _LANE, MESSAGES,
    ),
    MetricSpec(
        "spinf.batch.tokens", "histogram", "{token}",
        "How many packed tokens does a batch hold?", _LANE, TOKENS,
    ),
    MetricSpec(
        "spinf.batch.fill", "histogram", "1",
        "Which share of its lane's token budget does a batch use (1 = full passes, the efficient case)?", _LANE, SHARE,
    ),
    MetricSpec(
        "spinf.forward.duration", "histogram", "s",
        "How long does the engine take for one batch (its forward passes and reading the answers)?",
        _LANE, LATENCY_S,
    ),
    MetricSpec(
        "spinf.forward.passes", "counter", "{pass}",
        "How many forward passes has the engine run? (tokens computed / passes = tokens per pass)", _LANE,
    ),
    MetricSpec(
        "spinf.decode.passes", "counter", "{pass}",
        "How many of those passes were decode steps of extraction and generation questions (one per token of "
        "a batch's longest extraction)?", _LANE,
    ),
    MetricSpec(
        "spinf.tokens.extracted", "counter", "{token}",
        "How many tokens have extraction and generation questions written?", _LANE,
    ),
    MetricSpec(
        "spinf.tokens.computed", "counter", "{token}",
        "How many tokens went through the model, padding and recomputed content included?", _LANE,
    ),
    MetricSpec(
        "spinf.tokens.useful", "counter", "{token}",
        "How many of them were needed (each message's content once, each branch once)? 1 - useful/computed "
        "is the share spent on padding or recomputation.", _LANE,
    ),
    MetricSpec(
        "spinf.queue.duration", "histogram", "s",
        "How long do records wait between being read and their batch starting on the engine?", _LANE, LATENCY_S,
    ),
    MetricSpec(
        "spinf.end_to_end.latency", "histogram", "s",
        "How old is a record's input when its score is acknowledged (record timestamp to acknowledgement)?",
        (TOPIC,), LATENCY_S,
    ),
    # -- flow control and the consumer group --
    MetricSpec(
        "spinf.inflight.records", "gauge", "{record}",
        "How many records are read but not yet written and acknowledged (backpressure pauses at --max-inflight)?",
    ),
    MetricSpec(
        "spinf.partitions.paused", "gauge", "{partition}",
        "How many assigned partitions are paused for backpressure?",
    ),
    MetricSpec(
        "spinf.partitions.assigned", "gauge", "{partition}",
        "How many partitions does this member own?",
    ),
    MetricSpec(
        "spinf.consumer.lag", "gauge", "{message}",
        "Is the scorer keeping up? Records behind, per partition: log end offset - committed offset.",
        (GROUP, TOPIC, PARTITION),
    ),
    MetricSpec(
        "spinf.consumer.time_lag", "gauge", "s",
        "How far behind in time, per partition: now - timestamp of the oldest record read but not yet "
        "written (0 when nothing is in flight).",
        (GROUP, TOPIC, PARTITION),
    ),
    MetricSpec(
        "spinf.commits", "counter", "{commit}",
        "How many offset commits has the broker accepted?",
    ),
    MetricSpec(
        "spinf.commit.failures", "counter", "{commit}",
        "How many offset commits failed (retried at the next interval), by error.type?", (ERROR_TYPE,),
    ),
    MetricSpec(
        "spinf.rebalances", "counter", "{rebalance}",
        "How often did the group take partitions away from this member (rebalances)?",
    ),
    MetricSpec(
        "spinf.progress.stalled", "gauge", "s",
        "How long have records waited with none written (0 while records are written or none wait)? /healthz "
        "fails past --liveness-timeout-s.",
    ),
    # -- the process --
    MetricSpec(
        "spinf.queue.depth", "gauge", "{message}",
        "How many prepared messages wait in each (pack, model)'s micro-batcher for the engine?", _LANE,
    ),
    MetricSpec(
        "spinf.model.load.duration", "gauge", "s",
        "How long did loading the model (and pack) take at start-up (with --routes: the latest load)?",
    ),
    MetricSpec(
        "spinf.models.loaded", "gauge", "{model}",
        "How many models are in memory now (--routes loads and evicts them under --model-memory-budget)?",
    ),
    MetricSpec(
        "spinf.model.memory", "gauge", "By",
        "How many bytes of weights and KV working set does each loaded model count against the memory budget?",
        (MODEL,),
    ),
    MetricSpec(
        "spinf.model.loads", "counter", "{load}",
        "How many model loads have there been (the first of each, and each reload after an eviction)?",
    ),
    MetricSpec(
        "spinf.model.evictions", "counter", "{eviction}",
        "How many models were unloaded to fit the memory budget or for being idle (rate: swaps)?",
    ),
    MetricSpec(
        "spinf.info", "gauge", "1",
        "What is this scorer running? Always 1; the attributes say the model, pack, device, dtype and token budget.",
        (MODEL, PACK, PACK_VERSION, DEVICE, DTYPE, KERNELS, TOKEN_BUDGET),
    ),
    # -- the HTTP API (semantic conventions for HTTP servers) --
    MetricSpec(
        "http.server.request.duration", "histogram", "s",
        "How long do HTTP API requests take, per route and status? (429: the queue was full; 504: over the timeout)",
        (HTTP_METHOD, HTTP_ROUTE, HTTP_STATUS), LATENCY_S,
    ),
    MetricSpec(
        "http.server.active_requests", "gauge", "{request}",
        "How many HTTP API requests are in flight now (read, waiting or being answered)?",
    ),
    MetricSpec(
        "spinf.api.queue.duration", "histogram", "s",
        "How long do API messages wait between being queued and their batch starting on the engine "
        "(the latency window, and stream batches ahead of them on the engine thread)?", _LANE, LATENCY_S,
    ),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}

# OpenTelemetry -> Prometheus units (the exporter's mapping, for the units used above)
_PROM_UNITS = {"s": "seconds", "1": "", "By": "bytes"}


def prometheus_name(spec: MetricSpec) -> str:
    """The name under which the OpenTelemetry Prometheus exporter exposes ``spec``.

    OpenTelemetry's Prometheus compatibility rules: characters outside ``[a-zA-Z0-9:]`` become
    ``_``; the unit is appended unless it is a ``{annotation}`` or ``1`` (``s`` → ``_seconds``);
    counters end in ``_total``. Histograms expose ``<name>_bucket``, ``_sum`` and ``_count``.
    """
    name = re.sub(r"[^a-zA-Z0-9:]+", "_", spec.name)
    unit = "" if spec.unit.startswith("{") else _PROM_UNITS.get(spec.unit, spec.unit)
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    if spec.kind == "counter":
        name += "_total"
    return name


def prometheus_label(attribute: str) -> str:
    """The Prometheus label of an attribute key (``messaging.destination.name`` →
    ``messaging_destination_name``)."""
    return re.sub(r"[^a-zA-Z0-9]+", "_", attribute)
