"""Kafka checks before the slow part: is the broker there, do the topics exist.

``run`` calls :func:`check_run_topics` before it loads any weights, ``produce``/``consume`` call
:func:`check_topic`; each fails within a few seconds with a one-line
:class:`~spinf_stream.errors.UsageError` that names the address (or topic), the flag and its
``SPINF_*`` variable, and the likely cause.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from spinf_stream.config import KafkaSettings, RunSettings
from spinf_stream.errors import UsageError

log = logging.getLogger("spinf_stream.stream")

#: seconds for each step (name lookup + TCP connect, then the metadata request)
PREFLIGHT_TIMEOUT_S = 2.0

_BOOTSTRAP = "--bootstrap-servers, SPINF_BOOTSTRAP_SERVERS"


def _servers(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in (s.strip() for s in bootstrap.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--bootstrap-servers {item!r} (SPINF_BOOTSTRAP_SERVERS): expected host:port, e.g. kafka:9092")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise UsageError("--bootstrap-servers (SPINF_BOOTSTRAP_SERVERS) is empty: give host:port, e.g. kafka:9092")
    return out


async def _reach(host: str, port: int, timeout_s: float) -> str | None:
    """``None`` when a TCP connection opens, else the likely cause in words."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except socket.gaierror:
        return f"{host}:{port}: the host name does not resolve (a typo?)"
    except ConnectionRefusedError:
        return f"{host}:{port}: connection refused (nothing listens there: is the broker running, is the port right?)"
    except (TimeoutError, asyncio.TimeoutError):
        return f"{host}:{port}: no answer within {timeout_s:g} s (a wrong address, or a firewall?)"
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}"
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return None


async def connect(settings: KafkaSettings, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> tuple[AIOKafkaAdminClient, set[str]]:
    """An admin client on the cluster and the names of its topics; close the client when done.

    Raises:
        UsageError: no bootstrap server accepts a TCP connection (the cause per address), or the
            broker does not answer a Kafka metadata request (wrong security protocol or credentials).
    """
    servers = _servers(settings.bootstrap_servers)
    causes = await asyncio.gather(*(_reach(h, p, timeout_s) for h, p in servers))
    if all(causes):
        raise UsageError(
            f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({_BOOTSTRAP}): "
            + "; ".join(c for c in causes if c)
        )
    kwargs = {k: v for k, v in settings.client_kwargs().items() if k != "client_id"}
    admin = AIOKafkaAdminClient(**kwargs, request_timeout_ms=int(timeout_s * 1000))
    client_log = logging.getLogger("aiokafka")
    quiet = not client_log.isEnabledFor(logging.DEBUG)
    level = client_log.level
    if quiet:  # the failure is reported below, in one line; aiokafka's own ERROR lines would repeat it
        client_log.setLevel(logging.CRITICAL)
    try:
        await asyncio.wait_for(admin.start(), timeout_s * 2)
        topics = set(await asyncio.wait_for(admin.list_topics(), timeout_s * 2))
    except (KafkaError, OSError, TimeoutError, asyncio.TimeoutError) as e:
        await admin.close()
        why = str(e) or type(e).__name__
        raise UsageError(
            f"the Kafka broker at {settings.bootstrap_servers} accepts connections but does not answer Kafka "
            f"requests ({why}); check --security-protocol (SPINF_SECURITY_PROTOCOL, now {settings.security_protocol}) "
            "and the SASL/SSL settings"
        ) from None
    finally:
        if quiet:
            client_log.setLevel(level)
    return admin, topics


def _listing(topics: set[str]) -> str:
    shown = sorted(t for t in topics if not t.startswith("__"))
    return ", ".join(shown[:20]) + (", ..." if len(shown) > 20 else "") if shown else "none"


async def check_run_topics(
    settings: RunSettings, timeout_s: float = PREFLIGHT_TIMEOUT_S, *, inputs: list[str] | None = None,
    outputs: list[str] | None = None, routes_file: str | None = None,
) -> None:
    """``run``: the broker answers; every input topic exists (or, with ``--allow-missing-topics``,
    a warning); the output and dead-letter topics exist or are created now (with the partition
    count of the first input topic, so that unkeyed records keep their partition). ``inputs`` and
    ``outputs`` (output and dead-letter topics) default to the flags'; ``routes_file``: where they
    came from instead (named in errors).

    Raises:
        UsageError: unreachable broker, missing input topic, output topic that cannot be created.
    """
    inputs = list(settings.input_topic) if inputs is None else inputs
    outputs = [settings.output_topic, settings.dlq_topic] if outputs is None else outputs
    admin, existing = await connect(settings, timeout_s)
    try:
        missing = [t for t in dict.fromkeys(inputs) if t not in existing]
        if missing:
            what = f"input topic {', '.join(missing)} does not exist on {settings.bootstrap_servers} (topics there: {_listing(existing)})"
            if not settings.allow_missing_topics:
                fix = f"fix its route's topics in {routes_file}" if routes_file else "fix --input-topic (SPINF_INPUT_TOPIC)"
                raise UsageError(
                    f"{what}; {fix}, create it, or pass --allow-missing-topics (SPINF_ALLOW_MISSING_TOPICS) to wait for it"
                )
            log.warning("%s; scoring it once it is created (--allow-missing-topics)", what)
        absent = [t for t in dict.fromkeys(outputs) if t not in existing]
        if absent:
            await _create(admin, absent, settings, existing, inputs)
    finally:
        await admin.close()


async def _create(
    admin: AIOKafkaAdminClient, names: list[str], settings: RunSettings, existing: set[str], inputs: list[str]
) -> None:
    partitions = 1
    source = next((t for t in inputs if t in existing), None)
    try:
        if source is not None:
            described = await admin.describe_topics([source])
            partitions = max(1, len(described[0].get("partitions", ()))) if described else 1
        brokers = len((await admin.describe_cluster()).get("brokers", ())) or 1
        resp = await admin.create_topics(
            [NewTopic(n, num_partitions=partitions, replication_factor=min(3, brokers)) for n in names]
        )
        for topic, code, *rest in resp.topic_errors:
            if code and for_code(code) is not TopicAlreadyExistsError:
                raise for_code(code)(f"{topic}: {rest[0] if rest and rest[0] else ''}")
    except (KafkaError, OSError, TimeoutError, asyncio.TimeoutError) as e:
        raise UsageError(
            f"topic {', '.join(names)} does not exist on {settings.bootstrap_servers} and cannot be created "
            f"({type(e).__name__}: {e}); create it or fix --output-topic (SPINF_OUTPUT_TOPIC) / --dlq-topic "
            "(SPINF_DLQ_TOPIC)"
        ) from None
    log.info("created topic %s (%d partitions)", ", ".join(names), partitions)


async def check_topic(settings: KafkaSettings, topic: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> None:
    """``produce``/``consume``: the broker answers and ``topic`` exists.

    Raises:
        UsageError: unreachable broker or missing topic.
    """
    admin, existing = await connect(settings, timeout_s)
    await admin.close()
    if topic not in existing:
        raise UsageError(
            f"--topic {topic} (SPINF_TOPIC) does not exist on {settings.bootstrap_servers} (topics there: {_listing(existing)})"
        )


def run_check(coro: Any) -> None:
    """Run one of the async checks from synchronous code."""
    asyncio.run(coro)
