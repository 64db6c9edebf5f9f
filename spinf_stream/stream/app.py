"""Process-level glue of ``spinf-stream run``: logging, telemetry and its HTTP endpoint, loading
the engine, signals, exit codes."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from spinf_stream.config import RunSettings, ScoringSettings
from spinf_stream.stream.service import ScoringService
from spinf_stream.telemetry import StreamTelemetry, create_telemetry
from spinf_stream.telemetry.logs import LogFormat
from spinf_stream.telemetry.logs import configure_logging as _configure_logging
from spinf_stream.telemetry.providers import TelemetryConfigError
from spinf_stream.telemetry.server import OpsServer, OpsServerError

log = logging.getLogger("spinf_stream.stream")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130


def configure_logging(level: str, fmt: LogFormat = "text") -> None:
    """Log to stderr at ``level`` in ``fmt`` (``text`` or ``json``; see :mod:`spinf_stream.telemetry.logs`)."""
    _configure_logging(level, fmt)


class OperationsError(RuntimeError):
    """Telemetry or its endpoint cannot start (port in use, bad ``OTEL_*`` setting)."""


@contextmanager
def operations(settings: ScoringSettings, *, endpoint_required: bool = True) -> Iterator[StreamTelemetry]:
    """Telemetry for ``settings`` and, unless ``--metrics-port 0``, its HTTP endpoint (``/metrics``,
    ``/healthz``, ``/readyz``), up before the model loads so that probes answer during the load;
    on exit the endpoint stops and the exporters flush. With ``endpoint_required=False`` (``dev``)
    a port that cannot be bound is a warning, not an error.

    Raises:
        OperationsError: the port cannot be bound, or an ``OTEL_*`` variable is unusable.
    """
    try:
        telemetry = create_telemetry(settings)
    except TelemetryConfigError as exc:
        raise OperationsError(str(exc)) from exc
    server = None
    if settings.metrics_port:
        try:
            server = OpsServer(
                settings.metrics_host, settings.metrics_port, telemetry.health, telemetry.providers.registry
            ).start()
        except OpsServerError as exc:
            if endpoint_required:
                telemetry.providers.shutdown()
                raise OperationsError(str(exc)) from exc
            log.warning("%s; running without it", exc)
    try:
        yield telemetry
    finally:
        if server is not None:
            server.stop()
        telemetry.providers.shutdown()


def load_engine_timed(settings: ScoringSettings, telemetry: StreamTelemetry) -> Any:
    """:func:`load_engine`, its duration recorded as ``spinf.model.load.duration``."""
    t0 = time.perf_counter()
    engine = load_engine(settings)
    telemetry.model_load_time(time.perf_counter() - t0)
    return engine


def load_engine(settings: ScoringSettings) -> Any:
    """``Engine.load(model, pack, token_budget)`` from the settings (slow: loads the weights)."""
    from spinf_stream.engine import Engine

    log.info("loading model %s with pack %s", settings.model, settings.pack)
    return Engine.load(model=settings.model, pack=settings.pack, token_budget=settings.token_budget)


async def serve(service: ScoringService) -> int:
    """Run ``service`` with SIGTERM/SIGINT handlers: the first drains and stops it (exit 0; 1 if
    the drain outlasted ``--shutdown-timeout-s``), a second stops at once (offsets of unwritten
    records stay uncommitted; exit 130). A failure (e.g. a write the broker refused) exits 1."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    forced = False

    def on_signal(sig: signal.Signals) -> None:
        nonlocal forced
        if service.stopping:
            log.warning("%s again: stopping without draining", sig.name)
            forced = True
            if task is not None:
                task.cancel()
        else:
            log.info("%s: draining, writing and committing before exit", sig.name)
            service.stop()

    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread / platform without it
            pass
    try:
        await service.run()
        return EXIT_OK if service.drained else EXIT_FAILED
    except asyncio.CancelledError:
        if forced:
            return EXIT_INTERRUPTED
        raise
    except Exception as exc:
        log.error("scorer stopped on an error: %s: %s", type(exc).__name__, exc)
        return EXIT_FAILED
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def run_scorer(settings: RunSettings, scorer: Any | None = None) -> int:
    """``spinf-stream run``: start telemetry, load the engine (unless given), then score until a
    signal; exit code."""
    configure_logging(settings.log_level, settings.log_format)
    try:
        with operations(settings) as telemetry:
            if scorer is None:
                try:
                    scorer = load_engine_timed(settings, telemetry)
                except Exception as exc:
                    log.error("cannot load the engine: %s: %s", type(exc).__name__, exc)
                    return EXIT_CONFIG
            return asyncio.run(serve(ScoringService(settings, scorer, telemetry=telemetry)))
    except OperationsError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
