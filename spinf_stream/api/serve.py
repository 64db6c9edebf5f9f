"""Run the HTTP API on uvicorn inside the caller's event loop, and ``spinf-stream serve`` (the API
alone, no Kafka): the pack, the model on the engine thread, lanes for the server's calibration,
``auto`` and ``none``, and the server until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Any

from spinf_stream.config import ApiSettings, ServeSettings

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free one). Raises ``OSError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, reuse_port=False)


class ApiServer:
    """uvicorn serving ``app`` on ``sock`` as a task of the running loop (no signal handlers of
    its own: the caller stops it)."""

    def __init__(self, app: Any, sock: socket.socket) -> None:
        import contextlib

        import uvicorn

        class _Server(uvicorn.Server):
            def capture_signals(self) -> Any:  # the caller owns the signals
                return contextlib.nullcontext()

        self.sock = sock
        config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, timeout_keep_alive=5,
                                timeout_graceful_shutdown=5)
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]), name="spinf-api")
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def app_for(scoring: Any, settings: ApiSettings, telemetry: Any = None) -> Any:
    """The FastAPI app over ``scoring`` with ``settings``' keys and limits, reporting to ``telemetry``."""
    from spinf_stream.api.app import create_app, models_of

    return create_app(scoring, api_keys=[k.get_secret_value() for k in settings.api_key],
                      max_body_bytes=settings.api_max_body_bytes, max_messages=settings.api_max_messages,
                      timeout_s=settings.api_timeout_s, models=models_of(scoring), max_logprobs=settings.api_max_logprobs,
                      telemetry=telemetry)


def warn_if_open(settings: ApiSettings) -> None:
    if not settings.api_key:
        if settings.api_host is None:
            log.warning("no API key (--api-key, SPINF_API_KEYS): the API listens on loopback only")
        else:
            log.warning("no API key (--api-key, SPINF_API_KEYS): anyone who reaches %s may use the API", settings.api_host)


def run_serve(settings: ServeSettings) -> int:
    """``spinf-stream serve``; returns the exit code.

    Raises:
        UsageError (a port that cannot be bound), PackError, CalibrationError (and the model's
            errors): found before it listens.
    """
    from spinf_stream.cli.preflight import check_calibration, check_model_reference, check_pack
    from spinf_stream.errors import UsageError
    from spinf_stream.telemetry.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    pack = check_pack(settings.pack, "json")
    check_calibration(settings.calibration, pack)
    if settings.api_port == 0:
        raise UsageError("--api-port 0 (SPINF_API_PORT) turns the API off; serve is only the API: give it a port")
    try:  # before torch is imported (the model check imports it): a busy port is said at once
        sock = bind(settings.listen_host(), settings.api_port)
    except OSError as e:
        raise UsageError(f"--api-port {settings.api_port} (SPINF_API_PORT): cannot listen on "
                         f"{settings.listen_host()}:{settings.api_port}: {e.strerror or e}") from None
    check_model_reference(settings.model)
    from spinf_stream.api.scoring import Lane
    from spinf_stream.device import choose
    from spinf_stream.engine.pool import EnginePool
    from spinf_stream.stream.app import prepare_engine_thread
    from spinf_stream.stream.engine_thread import EngineThread

    placement = choose(settings.device, settings.dtype)
    with sock, EngineThread() as engine:
        threads = engine.call(prepare_engine_thread)
        pool = EnginePool(device=placement.device, dtype=placement.dtype, threads=threads,
                          allow_unstable_bits=settings.allow_unstable_bits)
        calibrations = list(dict.fromkeys([settings.calibration, "auto", "none"]))
        lanes = [
            Lane(f"{pack.name}|{c}", pack.name, pack.version, c, engine.call(
                pool.lane, pack, settings.model, token_budget=settings.token_budget, calibration=c,
                special_tokens_in_fields=settings.special_tokens_in_fields))
            for c in calibrations
        ]
        model = lanes[0].scorer.model_name
        log.info("loading model %s on %s (%s)", model, placement.device, placement.dtype)
        engine.call(pool.ensure, model)
        api = ApiBeside(settings, lanes, engine, sock, settings.token_budget, settings.max_batch_messages,
                        settings.too_long, settings.max_prepare_s)
        log.info("serving %s@%s with %s (and /openapi.json)", pack.name, pack.version, model)

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await api.start()
            await stop.wait()
            log.info("stop requested: finishing the requests in flight")
            await api.stop()

        asyncio.run(main())
    return 0


def bind_api(settings: ApiSettings, *, required: bool) -> socket.socket | None:
    """The API's listening socket for ``run``/``dev`` (``None`` with ``--api-port 0``). A port that
    cannot be bound is a :class:`UsageError` when ``required`` (``run``), else a warning and no
    API (``dev``)."""
    from spinf_stream.errors import UsageError

    if settings.api_port == 0:
        return None
    try:
        return bind(settings.listen_host(), settings.api_port)
    except OSError as e:
        msg = (f"--api-port {settings.api_port} (SPINF_API_PORT): cannot listen on "
               f"{settings.listen_host()}:{settings.api_port}: {e.strerror or e}")
        if required:
            raise UsageError(msg + " (--api-port 0 turns the API off)") from None
        log.warning("%s; no HTTP API", msg)
        return None


class ApiBeside:
    """The HTTP API on ``sock``: its requests batched onto ``engine_thread`` by ``lanes``. In
    ``run``/``dev`` the thread and the scorers are the stream's (a request's record equals the
    topic's, its batches run between the stream's); ``serve`` has its own. Started and stopped by
    the caller's event loop."""

    def __init__(self, settings: ApiSettings, lanes: list[Any], engine_thread: Any, sock: socket.socket,
                 token_budget: int, max_batch_messages: int, too_long: Any, max_prepare_s: float | None,
                 telemetry: Any = None) -> None:
        from spinf_stream.api.scoring import ApiScoring

        self.settings = settings
        self.scoring = ApiScoring(lanes, engine_thread, token_budget=token_budget, max_batch_messages=max_batch_messages,
                                  window_s=settings.api_window_ms / 1000, max_queued=settings.api_max_queue,
                                  too_long=too_long, max_prepare_s=max_prepare_s, telemetry=telemetry,
                                  inline_packs=settings.api_inline_packs)
        self.server = ApiServer(app_for(self.scoring, settings, telemetry), sock)

    async def start(self) -> None:
        self.scoring.start()
        await self.server.start()
        warn_if_open(self.settings)
        log.info("HTTP API on http://%s:%d (POST /v1/score, /v1/completions, GET /v1/packs, /v1/models)",
                 self.settings.listen_host(), self.server.port)

    async def stop(self) -> None:
        await self.server.stop()
        await self.scoring.stop()
