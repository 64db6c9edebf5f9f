"""Process-level glue of ``spinf-stream run``: logging, loading the engine, signals, exit codes."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

from spinf_stream.config import RunSettings, ScoringSettings
from spinf_stream.stream.service import ScoringService

log = logging.getLogger("spinf_stream.stream")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130


def configure_logging(level: str) -> None:
    """Log to stderr at ``level`` (aiokafka at WARNING unless DEBUG); no-op if already configured."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("spinf_stream").setLevel(level)
    logging.getLogger("aiokafka").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)


def load_engine(settings: ScoringSettings) -> Any:
    """``Engine.load(model, pack, token_budget)`` from the settings (slow: loads the weights)."""
    from spinf_stream.engine import Engine

    log.info("loading model %s with pack %s", settings.model, settings.pack)
    return Engine.load(
        model=settings.model, pack=settings.pack, token_budget=settings.token_budget, calibration=settings.calibration
    )


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
    """``spinf-stream run``: load the engine (unless given), then score until a signal; exit code."""
    configure_logging(settings.log_level)
    if scorer is None:
        try:
            scorer = load_engine(settings)
        except Exception as exc:
            log.error("cannot load the engine: %s: %s", type(exc).__name__, exc)
            return EXIT_CONFIG
    return asyncio.run(serve(ScoringService(settings, scorer)))
