"""Operations: OpenTelemetry metrics and traces, health probes, logs (module map below).

- ``metrics``: every metric's name, unit, attributes, buckets and the question it answers
- ``providers``: the SDK providers (Prometheus pull, OTLP push from ``OTEL_*`` variables)
- ``recorder``: :class:`StreamTelemetry`, what the scoring service calls at its few named points
- ``health``: liveness and readiness state (``/healthz``, ``/readyz``)
- ``server``: the HTTP endpoint on ``--metrics-port`` (``/metrics``, ``/healthz``, ``/readyz``)
- ``logs``: ``--log-format text|json``
- ``dashboard``: the Grafana dashboard, generated from ``metrics``

The stream imports this package; it imports nothing of the stream, engine or Kafka clients.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spinf_stream.config import ScoringSettings
from spinf_stream.telemetry.health import Health
from spinf_stream.telemetry.providers import build_providers
from spinf_stream.telemetry.recorder import EngineWork, PartitionSample, Sample, StreamTelemetry


def create_telemetry(
    settings: ScoringSettings,
    *,
    metric_readers: Sequence[Any] = (),
    span_exporter: Any = None,
    environ: Mapping[str, str] | None = None,
    prometheus: bool | None = None,
) -> StreamTelemetry:
    """The telemetry of a scorer run with ``settings``: Prometheus reader when ``--metrics-port``
    is not 0 (or as ``prometheus`` says), OTLP from the environment, ``--status-interval-s``,
    ``--lag-interval-s``, ``--liveness-timeout-s``.

    Raises:
        spinf_stream.telemetry.providers.TelemetryConfigError: an unusable ``OTEL_*`` setting.
    """
    providers = build_providers(
        prometheus=settings.metrics_port != 0 if prometheus is None else prometheus, metric_readers=metric_readers,
        span_exporter=span_exporter, environ=environ,
    )
    return StreamTelemetry(
        providers,
        Health(settings.liveness_timeout_s, rebalance_limit=settings.liveness_rebalances),
        group_id=settings.group_id,
        token_budget=settings.token_budget,
        status_interval_s=settings.status_interval_s,
        lag_interval_s=settings.lag_interval_s,
    )


__all__ = ["EngineWork", "Health", "PartitionSample", "Sample", "StreamTelemetry", "create_telemetry"]
