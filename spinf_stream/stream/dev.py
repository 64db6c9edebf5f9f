"""``spinf-stream dev``: the embedded broker, its topics, and the scorer, in one process.

Starts Tansu on a loopback port, creates the input, output and dead-letter topics, loads the
engine, runs the scorer; optionally publishes a JSON-lines file and prints every score and
dead-letter record to stdout. With ``--until-done`` it stops once each published message has a
record (the ``make demo`` path); otherwise it runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import orjson

from spinf_stream.config import DevSettings, RunSettings, ScoringSettings
from spinf_stream.errors import UsageError
from spinf_stream.stream.app import (
    EXIT_CONFIG,
    EXIT_OK,
    OperationsError,
    check_scoring,
    configure_logging,
    load_engine_timed,
    operations,
    serve,
)
from spinf_stream.stream.broker import EmbeddedBroker
from spinf_stream.stream.consume import format_record, read_topics
from spinf_stream.stream.engine_thread import EngineThread
from spinf_stream.stream.produce import lines_of, produce_lines
from spinf_stream.stream.service import ScoringService
from spinf_stream.stream.topics import ensure_topics
from spinf_stream.telemetry import StreamTelemetry

log = logging.getLogger("spinf_stream.stream")


def dev_run_settings(settings: DevSettings, bootstrap_servers: str) -> RunSettings:
    """The ``run`` settings of the scorer inside ``dev`` (no environment read: all from ``settings``)."""
    scoring = settings.model_dump(include=set(ScoringSettings.model_fields))
    return RunSettings.model_validate(
        {**scoring, "bootstrap_servers": bootstrap_servers, "security_protocol": "PLAINTEXT", "enable_idempotence": False}
    )


def _read_input(path: Any) -> list[bytes]:
    if str(path) == "-":
        return lines_of(sys.stdin.buffer)
    with open(path, "rb") as f:
        return lines_of(f)


async def run_dev_async(
    settings: DevSettings, broker: EmbeddedBroker, scorer: Any, telemetry: StreamTelemetry | None = None,
    engine_thread: EngineThread | None = None,
) -> int:
    run_settings = dev_run_settings(settings, broker.bootstrap_servers)
    kafka = run_settings.client_kwargs()
    topics = [*run_settings.input_topic, run_settings.output_topic, run_settings.dlq_topic]
    await ensure_topics(kafka, topics, partitions=settings.partitions)
    service = ScoringService(run_settings, scorer, telemetry=telemetry, engine_thread=engine_thread)
    scorer_task = asyncio.create_task(serve(service))

    expected: set[tuple[str, int, int]] | None = None
    seen: set[tuple[str, int, int]] = set()
    done = asyncio.Event()

    async def printer() -> None:
        async for rec in read_topics(kafka, [run_settings.output_topic, run_settings.dlq_topic]):
            if settings.print_records:
                sys.stdout.buffer.write(format_record(rec) + b"\n")
                sys.stdout.flush()
            try:
                src = orjson.loads(rec.value)["source"]
                seen.add((src["topic"], src["partition"], src["offset"]))
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            if expected is not None and expected <= seen:
                done.set()

    printer_task = asyncio.create_task(printer())
    try:
        if settings.input is not None:
            lines = _read_input(settings.input)
            await service.assigned.wait()
            topic = run_settings.input_topic[0]
            metas = await produce_lines(kafka, topic, lines, key_field=settings.key_field)
            expected = {(topic, m.partition, m.offset) for m in metas}
            log.info("published %d messages to %s", len(metas), topic)
            if expected <= seen:
                done.set()
        if settings.until_done and expected is not None:
            waiter = asyncio.create_task(done.wait())
            await asyncio.wait({waiter, scorer_task}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            service.stop()
        return await scorer_task
    finally:
        printer_task.cancel()
        await asyncio.gather(printer_task, return_exceptions=True)
        if not scorer_task.done():
            service.stop()
            await asyncio.gather(scorer_task, return_exceptions=True)


def run_dev(settings: DevSettings, scorer: Any | None = None) -> int:
    """``spinf-stream dev``; returns the exit code.

    Raises:
        UsageError, BrokerError (and the pack's and model's errors): a mistake found before the
            weights load (``--until-done`` without ``--input``, an unreadable input, a busy port).
    """
    from spinf_stream.cli.preflight import check_input_file

    configure_logging(settings.log_level, settings.log_format)
    if settings.until_done and settings.input is None:
        raise UsageError("--until-done (SPINF_UNTIL_DONE) needs --input (SPINF_INPUT): the file whose messages to wait for")
    if settings.input is not None:
        check_input_file(settings.input, "--input", "SPINF_INPUT")
    if scorer is None:
        check_scoring(settings)
    broker = EmbeddedBroker(settings.port).start()
    try:
        print(f"embedded Kafka broker (Tansu) on {broker.bootstrap_servers}", file=sys.stderr, flush=True)
        with operations(settings, endpoint_required=False) as telemetry, EngineThread() as engine_thread:
            if scorer is None:  # loaded on the thread that runs the passes: one OpenMP team
                scorer = engine_thread.call(load_engine_timed, settings, telemetry)
            code = asyncio.run(run_dev_async(settings, broker, scorer, telemetry, engine_thread))
            return EXIT_OK if code is None else code
    except OperationsError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    finally:
        broker.stop()
