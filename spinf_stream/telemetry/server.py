"""The operations HTTP endpoint on ``--metrics-port``: ``/metrics``, ``/healthz``, ``/readyz``.

A small threaded WSGI server (the standard library's ``wsgiref``, as ``prometheus_client`` itself
uses; a listen backlog of :data:`LISTEN_BACKLOG`, at most :data:`MAX_CONNECTIONS` served at once,
slow clients cut after :data:`CONNECTION_TIMEOUT_S`) running beside the event loop, not on it: a wedged loop can then still be reported by
``/healthz``. ``/metrics`` is ``prometheus_client``'s own WSGI app over the registry the
OpenTelemetry Prometheus reader fills; the probes answer ``200`` or ``503`` with a small JSON body
(``{"ok": ..., "reasons": [...]}``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson
from prometheus_client import CollectorRegistry, make_wsgi_app

from spinf_stream.telemetry.health import Check, Health

log = logging.getLogger(__name__)


#: Connections the kernel queues before the endpoint accepts them (the standard library's 5 made
#: a burst of 1,000 connections time out by the hundreds).
LISTEN_BACKLOG = 1024
#: Connections served at once (one thread each); more wait in the listen queue. High enough that
#: a thousand slow clients (slowloris) do not keep a probe waiting; each is cut after the timeout.
MAX_CONNECTIONS = 1024
#: Seconds a connection may take to send its request or read the answer (slow clients are cut).
CONNECTION_TIMEOUT_S = 10.0


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never blocks shutdown
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # at the cap, the accept loop waits: new connections queue in the kernel
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _QuietHandler(WSGIRequestHandler):
    timeout = CONNECTION_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # one line per scrape would drown the service's own logs


class OpsServerError(RuntimeError):
    """The endpoint could not bind its port."""


def _probe(check: Callable[[], Check]) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        c = check()
        body = orjson.dumps({"ok": c.ok, "reasons": list(c.reasons), **(c.detail or {})})
        start_response("200 OK" if c.ok else "503 Service Unavailable",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


class OpsServer:
    """Serves ``/metrics`` (when ``registry`` is given), ``/healthz`` and ``/readyz``.

    Args:
        host, port: where to listen (``port=0``: a free port, see :attr:`port`).
        health: the state the probes read.
        registry: the Prometheus registry to expose (``None``: no ``/metrics``, 404).

    Raises:
        OpsServerError: the port cannot be bound (in use, no permission).
    """

    def __init__(self, host: str, port: int, health: Health, registry: CollectorRegistry | None) -> None:
        routes: dict[str, Callable[..., Iterable[bytes]]] = {
            "/healthz": _probe(health.liveness),
            "/readyz": _probe(health.readiness),
        }
        if registry is not None:
            routes["/metrics"] = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            route = routes.get(environ.get("PATH_INFO", "").rstrip("/") or "/")
            if route is None:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not found: try /metrics, /healthz or /readyz\n"]
            return route(environ, start_response)

        try:
            self._httpd = make_server(host, port, app, _ThreadingWSGIServer, handler_class=_QuietHandler)
        except OSError as exc:
            raise OpsServerError(
                f"cannot serve metrics and health on {host}:{port}: {exc.strerror or exc} "
                "(pass another --metrics-port, or --metrics-port 0 to turn the endpoint off)"
            ) from exc
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="spinf-ops-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_port)

    def start(self) -> OpsServer:
        self._thread.start()
        log.info("metrics and health on http://%s:%d (/metrics, /healthz, /readyz)",
                 self._httpd.server_name, self.port)
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

