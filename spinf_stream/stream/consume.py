"""Read a topic from the beginning without a consumer group (``spinf-stream consume``, tests)."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer


async def read_topics(
    client_kwargs: dict[str, Any],
    topics: Sequence[str],
    *,
    max_records: int | None = None,
    idle_timeout_s: float | None = None,
) -> AsyncIterator[Any]:
    """Yield the records of ``topics`` (all partitions, from the earliest offset) as aiokafka
    ``ConsumerRecord`` objects. Stops after ``max_records`` or when nothing arrived for
    ``idle_timeout_s`` (``None``: follow forever)."""
    consumer = AIOKafkaConsumer(
        *topics, **client_kwargs, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    n = 0
    try:
        last = time.monotonic()
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for rec in records:
                    yield rec
                    n += 1
                    if max_records is not None and n >= max_records:
                        return
            if batch:
                last = time.monotonic()
            elif idle_timeout_s is not None and time.monotonic() - last >= idle_timeout_s:
                return
    finally:
        await consumer.stop()


def _text_or_b64(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(data).decode("ascii")}


def format_record(rec: Any, *, with_metadata: bool = False) -> bytes:
    """One JSON line for a record: its value as is when it is JSON (bytes unchanged), else the
    value as a JSON string; ``with_metadata`` wraps it with topic, partition, offset, timestamp,
    key and headers."""
    value = rec.value
    is_json = False
    if value is not None:
        try:
            orjson.loads(value)
            is_json = b"\n" not in value
        except orjson.JSONDecodeError:
            pass
    value_json = value if is_json else orjson.dumps(_text_or_b64(value))
    if not with_metadata:
        return value_json
    meta = orjson.dumps(
        {
            "topic": rec.topic,
            "partition": rec.partition,
            "offset": rec.offset,
            "timestamp": rec.timestamp,
            "key": _text_or_b64(rec.key),
            "headers": [[k, _text_or_b64(v)] for k, v in rec.headers or ()],
        }
    )
    return meta[:-1] + b',"value":' + value_json + b"}"
