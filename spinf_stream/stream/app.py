"""Process glue of ``spinf-stream run``.

Logging, checks before the slow part, telemetry
and its HTTP endpoint, loading the engine, signals, exit codes. Usage mistakes raise
:class:`~spinf_stream.errors.UsageError` (or the pack's and model's own errors) for
``spinf_stream.cli`` to print as one line (exit 2)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spinf_stream.config import RunSettings, ScoringSettings
from spinf_stream.stream.engine_thread import EngineThread
from spinf_stream.stream.topic_checks import check_run_topics, run_check
from spinf_stream.stream.service import ScoringService
from spinf_stream.telemetry import StreamTelemetry, create_telemetry
from spinf_stream.telemetry.recorder import ModelsSample
from spinf_stream.telemetry.logs import LogFormat
from spinf_stream.telemetry.logs import configure_logging as _configure_logging
from spinf_stream.telemetry.providers import TelemetryConfigError
from spinf_stream.telemetry.server import OpsServer, OpsServerError

if TYPE_CHECKING:
    from spinf_stream.routes import RoutesFile
    from spinf_stream.stream.routing import Router

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
    """:func:`load_engine`, its duration recorded as ``spinf.model.load.duration``, its model and
    bytes as the one model in memory (``spinf.models.loaded``, ``spinf.model.memory``)."""
    t0 = time.perf_counter()
    engine = load_engine(settings)  # first: the pool's module imports the engine's
    telemetry.model_load_time(time.perf_counter() - t0)
    from spinf_stream.engine.pool import engine_bytes

    loaded = ((engine.model_info.name, engine_bytes(engine) if hasattr(engine, "decoder") else None),)
    telemetry.watch_models(lambda: ModelsSample(loaded, loads=1, evictions=0))
    return engine


def check_scoring(settings: ScoringSettings, *, model: bool = True) -> None:
    """What ``run`` and ``dev`` can check in milliseconds: the pack (and that ``--input-format
    text`` has one field to fill) and, with ``model``, the model reference and ``--device``/
    ``--dtype`` (with ``SPINF_KERNELS``) on this machine (they import torch, so they come after the
    broker checks). Raises ``UsageError``, ``PackError``, ``CalibrationError``,
    ``ModelNotInstalled`` or ``ModelLoadError``."""
    from spinf_stream.device import choose
    from spinf_stream.cli.preflight import check_calibration, check_model_reference, check_pack

    pack = check_pack(settings.pack, settings.input_format)
    check_calibration(settings.calibration, pack)
    if model:
        check_model_reference(settings.model)
        choose(settings.device, settings.dtype)  # before dev starts its broker, not after


def prepare_engine_thread() -> int:
    """Size the threads of the engine, on the engine thread before the model loads (the rule:
    README, "The service"): the CPU engine's compute workers take every usable CPU
    (:func:`spinf_stream.device.size_cpu_threads`; ``OMP_NUM_THREADS`` overrides; each runs
    torch with one thread), and the tokenizer's own thread pool is off
    (``TOKENIZERS_PARALLELISM=false`` unless set): tokenizing runs on one thread beside the
    engine, and a pool would spread each message's few strings over every CPU, waking threads on
    the cores the engine computes on (measured: ~1,400 wake-ups per 400 messages with the pool,
    3 without, in the same time). Returns the compute workers.

    Raises:
        UsageError: ``OMP_NUM_THREADS`` is not a positive integer.
    """
    from spinf_stream.device import size_cpu_threads, usable_cpus
    from spinf_stream.errors import UsageError

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        threads = size_cpu_threads()
    except ValueError as e:
        raise UsageError(str(e)) from None
    log.info("engine: %d compute workers of one torch thread each (usable CPUs: %d); tokenization: 1 thread",
             threads, usable_cpus())
    return threads


def load_engine(settings: ScoringSettings) -> Any:
    """Check ``--device``/``--dtype`` on this machine, size the engine's threads
    (:func:`prepare_engine_thread`), then ``Engine.load`` (slow: the weights). Call it on the
    thread that will run the forward passes (:class:`~spinf_stream.stream.engine_thread.EngineThread`).

    Raises:
        UsageError: a device or dtype this machine cannot run (says what to use instead).
    """
    from spinf_stream.device import choose
    from spinf_stream.engine import Engine

    placement = choose(settings.device, settings.dtype)
    threads = prepare_engine_thread()
    log.info("loading model %s with pack %s on %s (%s)", settings.model, settings.pack, placement.device, placement.dtype)
    engine = Engine.load(
        model=settings.model, pack=settings.pack, token_budget=settings.token_budget,
        device=placement.device, dtype=placement.dtype,
        special_tokens_in_fields=settings.special_tokens_in_fields, calibration=settings.calibration,
        allow_unstable_bits=settings.allow_unstable_bits, threads=threads,
    )
    log.info("pack %s %s reads the field(s) %s of each message's JSON object (a record without one is "
             "dead-lettered as missing_field)", engine.pack.name, engine.pack.version, ", ".join(engine.pack.fields))
    info = engine.model_info
    calibration = getattr(engine, "calibration", None)  # not part of the Scorer protocol
    log.info(
        "model %s (weights sha256 %s) on %s in %s, kernels %s; calibration %s",
        info.name, info.sha256, placement.device, info.dtype, info.kernels, calibration.id if calibration else "none",
    )
    return engine


#: After a second signal, the process ends within this many seconds whatever it is doing.
FORCED_EXIT_S = 15.0


def _exit_now(code: int) -> None:
    """End the process at once with ``code``, logs flushed: no interpreter shutdown, which would
    wait for (or abort on) the engine's and tokenizer's native threads mid-computation."""
    logging.shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def api_beside(settings: ScoringSettings, service: ScoringService, checked: CheckedRoutes | None, engine_thread: Any,
               sock: Any) -> Any:
    """The HTTP API beside ``service`` on ``sock`` (``None`` without a socket: no API)."""
    if sock is None:
        return None
    from spinf_stream.api.serve import ApiBeside

    return ApiBeside(settings, api_lanes(settings, service, checked), engine_thread, sock, settings.token_budget,
                     settings.max_batch_messages, settings.too_long, settings.max_prepare_s, telemetry=service.telemetry)


def api_lanes(settings: ScoringSettings, service: ScoringService, checked: CheckedRoutes | None) -> list[Any]:
    """The API's lanes over the service's scorers: each lane's pack, version and calibration
    (the routes file's, or ``--calibration``)."""
    from spinf_stream.api.scoring import Lane

    calibrations = ({k: p.calibration for k, p in checked.file.lanes().items()} if checked is not None
                    else dict.fromkeys(service.lanes, settings.calibration))
    return [Lane(k, str(s.pack.name), str(s.pack.version), calibrations[k], s) for k, s in service.lanes.items()]


async def serve(service: ScoringService, api: Any = None) -> int:
    """Run ``service`` (and ``api``, an :class:`~spinf_stream.api.serve.ApiBeside`, beside it)
    with SIGTERM/SIGINT handlers: the first drains and stops it (exit 0; 1 if
    the drain outlasted ``--shutdown-timeout-s``), a second stops at once: what was written is
    flushed and what was acknowledged committed (a few seconds at most), offsets of unwritten
    records stay uncommitted, exit 130 (:func:`run_scorer` ends the process without waiting for
    the engine). A failure (e.g. a write the broker refused) exits 1."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    forced = False

    def on_signal(sig: signal.Signals) -> None:
        nonlocal forced
        if service.stopping:
            if forced:
                return
            log.warning("%s again: stopping without draining", sig.name)
            forced = True
            service.abort()
            watchdog = threading.Timer(FORCED_EXIT_S, _exit_now, (EXIT_INTERRUPTED,))
            watchdog.daemon = True
            watchdog.start()
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
        if api is not None:
            await api.start()
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
        if api is not None:
            await api.stop()
        for sig in installed:
            loop.remove_signal_handler(sig)


def _catch_signals_before_serving(caught: list[signal.Signals]) -> dict[signal.Signals, Any]:
    """Until :func:`serve` installs its handlers (checks and the model load take seconds), a
    SIGTERM/SIGINT is recorded in ``caught`` instead of killing the process (exit 143, or a
    KeyboardInterrupt traceback); a second one ends it at once with exit 130. Nothing is consumed
    before serving, so there is nothing to drain. Returns the handlers it replaced."""

    def on_signal(signum: int, _frame: Any) -> None:
        caught.append(signal.Signals(signum))
        if len(caught) > 1:
            log.warning("%s again before the scorer started: exiting", caught[-1].name)
            _exit_now(EXIT_INTERRUPTED)
        log.info("%s before the scorer started: exiting once it is loaded, consuming nothing", caught[-1].name)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread
            break
    return previous


def run_scorer(settings: RunSettings, scorer: Any | None = None) -> int:
    """``spinf-stream run``: check the pack, the model reference, the broker and the topics; start
    telemetry and its endpoint; load the engine (unless given) and score until a signal; returns
    the exit code. A SIGTERM/SIGINT before scoring starts (during the checks or the model load)
    ends it once loaded with exit 0, nothing consumed; a second one at once with 130.

    Raises:
        UsageError (and the pack's and model's errors): a mistake found before the weights load.
    """
    configure_logging(settings.log_level, settings.log_format)
    caught: list[signal.Signals] = []
    previous = _catch_signals_before_serving(caught)
    try:
        return _run_scorer(settings, scorer, caught)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_scorer(settings: RunSettings, scorer: Any | None, caught: list[signal.Signals]) -> int:
    checked = None
    if settings.routes is not None and scorer is None:
        from spinf_stream.device import choose

        checked = check_routes_file(settings, models=False)
        outputs = [*checked.router.output_topics, checked.file.dead_letter_topic]
        run_check(check_run_topics(settings, inputs=checked.file.input_topics, outputs=outputs, routes_file=checked.path))
        check_routes_file(settings)
        choose(settings.device, settings.dtype)  # routed_service writes dead letters to the file's topic
    elif scorer is None:
        check_scoring(settings, model=False)
        run_check(check_run_topics(settings))
        check_scoring(settings)
    from spinf_stream.api.serve import bind_api

    sock = bind_api(settings, required=True)  # before the weights: a busy port is said at once
    try:
        with operations(settings) as telemetry, EngineThread() as engine_thread:
            if checked is not None:  # the engine pool, each route's first model loaded
                service = routed_service(settings, checked, telemetry, engine_thread)
            else:
                if scorer is None:  # loaded on the thread that runs the passes: one OpenMP team
                    scorer = engine_thread.call(load_engine_timed, settings, telemetry)
                service = ScoringService(settings, scorer, telemetry=telemetry, engine_thread=engine_thread)
            if caught:  # nothing consumed; ended like a forced stop (the engine's native threads)
                _exit_now(EXIT_OK)
            code = asyncio.run(serve(service, api_beside(settings, service, checked, engine_thread, sock)))
            if code == EXIT_INTERRUPTED:
                _exit_now(code)
            return code
    except OperationsError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG


#: Flags a routes file replaces (each route names its topics, packs, models, calibrations, budgets).
ROUTE_FLAGS = ("input_topic", "output_topic", "dlq_topic", "pack", "model", "calibration", "token_budget")


@dataclass(frozen=True)
class CheckedRoutes:
    """A routes file checked before any weight loads: the file, its path, each lane's pack (by
    lane key), and the router."""

    file: RoutesFile
    path: str
    packs: dict[str, Any]
    router: Router


def check_routes_file(settings: ScoringSettings, *, models: bool = True) -> CheckedRoutes:
    """``--routes``: no flag it replaces is given, the file is valid, every pack and calibration
    loads, and (with ``models``) every model reference resolves; no weights are read.

    Raises:
        UsageError: naming the file and key, or the flags given beside ``--routes``.
    """
    from spinf_stream.errors import UsageError
    from spinf_stream.routes import check_routes, load_routes
    from spinf_stream.stream.routing import router_for

    assert settings.routes is not None
    given = [f for f in ROUTE_FLAGS if f in settings.model_fields_set]
    if given:
        flags = ", ".join("--" + f.replace("_", "-") for f in given)
        raise UsageError(f"{flags} and --routes: the routes file names topics, packs and models; give them there")
    path = str(settings.routes)
    routes = load_routes(path)
    packs = check_routes(routes, path, input_format=settings.input_format, models=models)
    router = router_for(routes, {k: (str(p.name), str(p.version)) for k, p in packs.items()})
    return CheckedRoutes(routes, path, packs, router)


def load_pool(settings: ScoringSettings, checked: CheckedRoutes, telemetry: StreamTelemetry) -> tuple[Any, dict[str, Any]]:
    """On the engine thread: size its threads, make the engine pool (``--model-memory-budget``,
    ``--model-idle-evict-s``), register every lane (tokenizers, calibrations: no weights), then
    load each route's first model in turn (each load timed as ``spinf.model.load.duration``).
    Returns ``(pool, {lane key: lane scorer})``.

    Raises:
        UsageError: a lane that cannot be made (a calibration for other weights, ...), naming the
            file and key.
    """
    from spinf_stream.device import choose
    from spinf_stream.engine.pool import EnginePool, ModelLoadFailed
    from spinf_stream.errors import UsageError

    placement = choose(settings.device, settings.dtype)
    threads = prepare_engine_thread()
    budget = int(settings.model_memory_budget * 2**30) if settings.model_memory_budget else None
    pool = EnginePool(
        device=placement.device, dtype=placement.dtype, threads=threads, budget_bytes=budget,
        idle_evict_s=settings.model_idle_evict_s, allow_unstable_bits=settings.allow_unstable_bits,
    )
    lanes: dict[str, Any] = {}
    for i, route in enumerate(checked.file.routes):
        for j, p in enumerate(route.packs):
            if p.lane in lanes:
                continue
            try:
                lanes[p.lane] = pool.lane(
                    checked.packs[p.lane], p.model, token_budget=p.token_budget, calibration=p.calibration,
                    special_tokens_in_fields=settings.special_tokens_in_fields,
                )
            except Exception as e:
                raise UsageError(f"{checked.path}: routes[{i}].packs[{j}]: {type(e).__name__}: {e}") from None
    for route in checked.file.routes:
        model = route.packs[0].model
        log.info("loading model %s (the first of a route) on %s (%s)", model, placement.device, placement.dtype)
        t0 = time.perf_counter()
        try:
            pool.ensure(model)
        except ModelLoadFailed as e:  # its route's records are dead-lettered; the others are scored
            log.error("%s; the records of its packs go to the dead-letter topic as %s", e, e.error_kind)
            continue
        telemetry.model_load_time(time.perf_counter() - t0)
    telemetry.watch_models(lambda: ModelsSample(
        tuple((x.name, x.bytes) for x in pool.loaded), pool.loads, pool.evictions))
    return pool, lanes


def routed_service(
    settings: RunSettings, checked: CheckedRoutes, telemetry: StreamTelemetry, engine_thread: EngineThread
) -> ScoringService:
    """The service of a routes file: its engine pool and lanes made on ``engine_thread``
    (:func:`load_pool`), the pool's idle eviction as housekeeping, the scheduling flags."""
    pool, lanes = engine_thread.call(load_pool, settings, checked, telemetry)
    return ScoringService(
        settings.model_copy(update={"dlq_topic": checked.file.dead_letter_topic}), lanes=lanes, router=checked.router,
        telemetry=telemetry, engine_thread=engine_thread,
        budgets={k: p.token_budget for k, p in checked.file.lanes().items()}, housekeeping=pool.evict_idle,
        fairness_cap=settings.fairness_cap, swap_wait_s=settings.model_swap_wait_ms / 1000,
    )
