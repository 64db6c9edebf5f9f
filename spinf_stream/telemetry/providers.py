"""OpenTelemetry SDK providers of one scorer process: where metrics and traces go.

- Metrics: a Prometheus pull reader (its own ``CollectorRegistry``, served on ``--metrics-port``)
  and, when the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``
  variable is set, an OTLP push exporter (every ``OTEL_METRIC_EXPORT_INTERVAL`` ms, 60 s by
  default). ``OTEL_METRICS_EXPORTER=none`` turns the push off.
- Traces: an OTLP exporter when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (``OTEL_TRACES_EXPORTER=none`` turns it off),
  behind a batch span processor; otherwise no tracer at all, so tracing costs nothing.
  ``OTEL_TRACES_SAMPLER`` applies (default: parent-based, always on).

OTLP goes over HTTP/protobuf (``opentelemetry-exporter-otlp-proto-http``); every other
``OTEL_EXPORTER_OTLP_*`` variable (headers, certificates, timeouts) is read by the exporter
itself. ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` name the resource (default
service name ``spinf-stream``).

The providers are objects owned by the process, never installed as OpenTelemetry's globals, so
several services (tests) live side by side.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)

SERVICE_NAME = "spinf-stream"


class TelemetryConfigError(ValueError):
    """An ``OTEL_*`` variable asks for something this build cannot do."""


@dataclass
class Providers:
    """The SDK objects of one process (any may be ``None``: that signal is off)."""

    meter_provider: MeterProvider | None
    tracer_provider: TracerProvider | None
    registry: CollectorRegistry | None  # what /metrics serves

    def shutdown(self) -> None:
        """Flush and stop the exporters (pushes what is buffered)."""
        for p in (self.tracer_provider, self.meter_provider):
            if p is not None:
                try:
                    p.shutdown()
                except Exception as exc:  # a collector that went away must not fail the exit
                    log.warning("telemetry shutdown: %s: %s", type(exc).__name__, exc)


def _wants_otlp(environ: Mapping[str, str], signal: str) -> bool:
    if environ.get(f"OTEL_{signal.upper()}_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"))


def _endpoint(environ: Mapping[str, str], signal: str) -> str:
    """The signal's URL: ``OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT`` as is, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/<signal>`` (the OTLP exporter specification's rule)."""
    own = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    if own:
        return own
    return environ["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + f"/v1/{signal}"


def _check_protocol(environ: Mapping[str, str], signal: str) -> None:
    proto = environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if proto and proto.strip() != "http/protobuf":
        raise TelemetryConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={proto!r}: spinf-stream exports OTLP over http/protobuf only "
            "(point the endpoint at the collector's HTTP port, 4318)"
        )


def build_providers(
    *,
    prometheus: bool,
    metric_readers: Sequence[MetricReader] = (),
    span_exporter: SpanExporter | None = None,
    environ: Mapping[str, str] | None = None,
) -> Providers:
    """Providers for the readers and exporters asked for.

    Args:
        prometheus: add a Prometheus pull reader (with its own registry).
        metric_readers: more readers (tests pass an ``InMemoryMetricReader``).
        span_exporter: export spans here, synchronously (tests: ``InMemorySpanExporter``);
            otherwise OTLP when the environment asks for it.
        environ: the ``OTEL_*`` variables (default: ``os.environ``).

    Raises:
        TelemetryConfigError: an OTLP protocol other than ``http/protobuf``.
    """
    env = os.environ if environ is None else environ
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or SERVICE_NAME})

    readers: list[MetricReader] = list(metric_readers)
    registry: CollectorRegistry | None = None
    if prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        registry = CollectorRegistry(auto_describe=False)
        readers.append(PrometheusMetricReader(registry=registry, scope_info_enabled=False))
    if _wants_otlp(env, "metrics"):
        _check_protocol(env, "metrics")
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=_endpoint(env, "metrics"))))
    meter_provider = MeterProvider(metric_readers=readers, resource=resource) if readers else None

    tracer_provider: TracerProvider | None = None
    if span_exporter is not None:
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif _wants_otlp(env, "traces"):
        _check_protocol(env, "traces")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=_endpoint(env, "traces"))))
    return Providers(meter_provider, tracer_provider, registry)
