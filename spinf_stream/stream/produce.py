"""Publish JSON lines to a topic (``spinf-stream produce``), one record per non-blank line."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata


def record_key(line: bytes, key_field: str | None) -> bytes | None:
    """The record key of a line: the UTF-8 of ``line[key_field]`` (a string, or the JSON text of
    another value) when the line is a JSON object holding it; else ``None`` (no key)."""
    if not key_field:
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get(key_field) is None:
        return None
    value = obj[key_field]
    return value.encode() if isinstance(value, str) else orjson.dumps(value)


def lines_of(data: Iterable[bytes]) -> list[bytes]:
    """Non-blank lines without their line endings (the bytes otherwise unchanged)."""
    out = []
    for raw in data:
        line = raw.rstrip(b"\r\n")
        if line.strip():
            out.append(line)
    return out


async def produce_values(
    client_kwargs: dict[str, Any],
    topic: str,
    values: Iterable[bytes | None],
    *,
    keys: Iterable[bytes | None] | None = None,
    headers: Iterable[list[tuple[str, bytes]] | None] | None = None,
    max_request_size: int = 1024 * 1024,
) -> list[RecordMetadata]:
    """Write ``values`` to ``topic`` in order; return each record's metadata (partition, offset).
    ``max_request_size``: the producer's largest record (bytes; Kafka's default 1 MiB).

    Waits for every acknowledgement; raises the producer's error if one fails.
    """
    values = list(values)
    keys = list(keys) if keys is not None else [None] * len(values)
    hdrs = list(headers) if headers is not None else [None] * len(values)
    producer = AIOKafkaProducer(
        **client_kwargs, acks="all", enable_idempotence=False, linger_ms=5, max_request_size=max_request_size
    )
    await producer.start()
    try:
        futures = []
        for value, key, h in zip(values, keys, hdrs):
            futures.append(await producer.send(topic, value, key=key, headers=h or None))
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


async def produce_lines(
    client_kwargs: dict[str, Any], topic: str, lines: Iterable[bytes], *, key_field: str | None = None
) -> list[RecordMetadata]:
    """Write each line as one record (key from ``key_field``, see :func:`record_key`)."""
    lines = list(lines)
    return await produce_values(client_kwargs, topic, lines, keys=[record_key(li, key_field) for li in lines])
