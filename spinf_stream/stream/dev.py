"""``spinf-stream dev``: the embedded broker, its topics, and the scorer, in one process.

Starts Tansu on a loopback port, creates the input, output and dead-letter topics, loads the
engine, runs the scorer; optionally publishes a JSON-lines file and shows the score and
dead-letter records of its messages on stdout (``--print jsonl|table|none``, ``--records FILE``). With ``--until-done`` it stops once each published message has a
record (the ``make demo`` path); otherwise it runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any

import orjson

from spinf_stream.config import DevSettings, RunSettings, ScoringSettings
from spinf_stream.errors import UsageError
from spinf_stream.stream.app import (
    EXIT_CONFIG,
    EXIT_OK,
    api_beside,
    CheckedRoutes,
    OperationsError,
    check_routes_file,
    check_scoring,
    configure_logging,
    load_engine_timed,
    routed_service,
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


class _Shown:
    """What ``dev`` shows of the records it reads: the records of the messages it published (with
    ``--input``; records read before their offsets are known wait), as JSON lines on stdout, into
    ``--records``, or as a table printed when dev stops."""

    def __init__(self, settings: DevSettings, packs: list[Any] | None = None) -> None:
        from spinf_stream.packs import load_pack

        packs = packs or [load_pack(settings.pack)]  # with --routes: every pack, in the file's order
        self.mode = settings.print
        self.text_field = packs[0].fields[0]
        self.questions = {str(p.name): [q.id for q in p.expand()] for p in packs}
        self.expected: set[tuple[str, int, int]] | None = None
        self.waiting = settings.input is not None
        self.held: list[tuple[Any, tuple[str, int, int] | None]] = []
        self.where: dict[tuple[str, int, int], tuple[int, str | None]] = {}  # source -> (input line, text)
        self.rows: list[tuple[int, dict[str, Any], str | None]] = []
        if settings.records is not None:
            settings.records.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(settings.records, "wb") if settings.records is not None else None  # noqa: SIM115

    def published(self, topic: str, lines: list[bytes], metas: list[Any]) -> None:
        for i, (line, m) in enumerate(zip(lines, metas)):
            try:
                text = orjson.loads(line).get(self.text_field)
            except (orjson.JSONDecodeError, AttributeError):
                text = None
            self.where[(topic, m.partition, m.offset)] = (i, text if isinstance(text, str) else None)
        self.expected = set(self.where)
        self.waiting = False
        held, self.held = self.held, []
        for rec, src in held:
            self.add(rec, src)

    def add(self, rec: Any, src: tuple[str, int, int] | None) -> None:
        if self.waiting:
            self.held.append((rec, src))
            return
        if self.expected is not None and src not in self.expected:
            return  # another member's record (a group shared with other scorers)
        line = format_record(rec)
        if self.file is not None:
            self.file.write(line + b"\n")
            self.file.flush()
        if self.mode == "jsonl":
            sys.stdout.buffer.write(line + b"\n")
            sys.stdout.flush()
        elif self.mode == "table":
            try:
                plain = orjson.loads(rec.value)
            except (orjson.JSONDecodeError, TypeError):
                return
            at, text = self.where.get(src, (len(self.where) + len(self.rows), None)) if src else (len(self.rows), None)
            self.rows.append((at, plain, text))

    def close(self, seconds: float) -> None:
        if self.file is not None:
            self.file.close()
        if self.mode == "table":
            from rich.console import Console

            from spinf_stream.table import ResultsView

            first = next(iter(self.questions))
            views = {name: ResultsView(q) for name, q in self.questions.items()}  # a table per pack
            for _, plain, text in sorted(self.rows, key=lambda r: r[0]):
                views.get(str((plain.get("pack") or {}).get("name")), views[first]).add(plain, text)
            for name, view in views.items():
                if len(views) > 1:
                    print(f"pack {name}:", flush=True)
                view.print(Console(), seconds)
        if self.file is not None:
            print(f"records (JSON Lines, one per message): {self.file.name}", file=sys.stderr, flush=True)


async def run_dev_async(
    settings: DevSettings, broker: EmbeddedBroker, scorer: Any, telemetry: StreamTelemetry | None = None,
    engine_thread: EngineThread | None = None, checked: CheckedRoutes | None = None, api_sock: Any = None,
) -> int:
    """Create the topics, run the scorer (``scorer``, or with ``--routes`` the ``checked`` routes'
    engine pool, made on ``engine_thread``), publish ``--input`` and show the records."""
    run_settings = dev_run_settings(settings, broker.bootstrap_servers)
    kafka = run_settings.client_kwargs()
    if checked is None:
        inputs, outputs = list(run_settings.input_topic), [run_settings.output_topic, run_settings.dlq_topic]
        service = ScoringService(run_settings, scorer, telemetry=telemetry, engine_thread=engine_thread)
        packs = None
    else:
        assert engine_thread is not None and telemetry is not None
        inputs, outputs = checked.file.input_topics, [*checked.router.output_topics, checked.file.dead_letter_topic]
        service = routed_service(run_settings, checked, telemetry, engine_thread)
        packs = list({str(p.name): p for p in checked.packs.values()}.values())
    await ensure_topics(kafka, list(dict.fromkeys([*inputs, *outputs])), partitions=settings.partitions)
    api = api_beside(settings, service, checked, engine_thread, api_sock) if engine_thread is not None else None
    scorer_task = asyncio.create_task(serve(service, api))

    expected: set[tuple[str, int, int]] | None = None
    seen: set[tuple[str, int, int]] = set()  # input records that got every record they owe
    packs_seen: dict[tuple[str, int, int], set[str]] = {}
    owed = 1  # records per input message: one per pack of the input topic's route
    done = asyncio.Event()
    shown = _Shown(settings, packs)
    started = time.perf_counter()

    async def printer() -> None:
        async for rec in read_topics(kafka, list(dict.fromkeys(outputs))):
            try:
                body = orjson.loads(rec.value)
                src = body["source"]
                key: tuple[str, int, int] | None = (src["topic"], src["partition"], src["offset"])
                block = body.get("pack") or {}
                pack = f"{block['name']}@{block.get('version')}" if block else None  # two versions of a pack may share a route
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
                key = pack = None
            shown.add(rec, key)
            if key is None:
                continue
            got = packs_seen.setdefault(key, set())
            got.add(pack if isinstance(pack, str) else "")
            if "" in got or len(got) >= owed:  # a dead letter of the whole message, or every pack's record
                seen.add(key)
            if expected is not None and expected <= seen:
                done.set()

    printer_task = asyncio.create_task(printer())
    try:
        if settings.input is not None:
            lines = _read_input(settings.input)
            await service.assigned.wait()
            topic = inputs[0]
            if checked is not None:
                targets = checked.router.route(topic, None)
                owed = len(targets) if isinstance(targets, tuple) else 1
            metas = await produce_lines(kafka, topic, lines, key_field=settings.key_field)
            expected = {(topic, m.partition, m.offset) for m in metas}
            shown.published(topic, lines, metas)
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
        shown.close(time.perf_counter() - started)


def run_dev(settings: DevSettings, scorer: Any | None = None) -> int:
    """``spinf-stream dev``; returns the exit code.

    Raises:
        UsageError, BrokerError (and the pack's and model's errors): a mistake found before the
            weights load (``--until-done`` without ``--input``, an unreadable input, a busy port).
    """
    from spinf_stream.cli.preflight import check_input_file, check_output_file

    configure_logging(settings.log_level, settings.log_format)
    if settings.until_done and settings.input is None:
        raise UsageError("--until-done (SPINF_UNTIL_DONE) needs --input (SPINF_INPUT): the file whose messages to wait for")
    if settings.input is not None:
        check_input_file(settings.input, "--input", "SPINF_INPUT")
    if settings.records is not None:
        check_output_file(settings.records, "--records", "SPINF_RECORDS", input_path=settings.input)
    checked = None
    if settings.routes is not None and scorer is None:
        from spinf_stream.device import choose

        checked = check_routes_file(settings)
        choose(settings.device, settings.dtype)
    elif scorer is None:
        check_scoring(settings)
    from spinf_stream.api.serve import bind_api

    api_sock = bind_api(settings, required=False)  # a busy port: a warning, no API
    broker = EmbeddedBroker(settings.port).start()
    try:
        print(f"embedded Kafka broker (Tansu) on {broker.bootstrap_servers}", file=sys.stderr, flush=True)
        with operations(settings, endpoint_required=False) as telemetry, EngineThread() as engine_thread:
            if checked is None and scorer is None:  # loaded on the thread that runs the passes: one OpenMP team
                scorer = engine_thread.call(load_engine_timed, settings, telemetry)
            code = asyncio.run(run_dev_async(settings, broker, scorer, telemetry, engine_thread, checked, api_sock))
            return EXIT_OK if code is None else code
    except OperationsError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    finally:
        broker.stop()
