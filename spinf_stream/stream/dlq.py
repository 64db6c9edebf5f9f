"""Build dead-letter records and the Kafka headers of everything the scorer writes."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import Literal

import orjson

from spinf_stream.records import ModelRef
from spinf_stream.stream.records import DeadLetterError, DeadLetterRecord, Header, Source

#: A dead-letter record keeps at most this many bytes of the original value, so that the record
#: (base64 is 4/3 of the bytes) stays under Kafka's default 1 MiB message size.
MAX_DLQ_VALUE_BYTES = 512 * 1024

#: Input headers copied onto the records the scorer writes (W3C trace context).
PASSTHROUGH_HEADERS = ("traceparent", "tracestate")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def dead_letter(
    *,
    kind: str,
    message: str,
    source: Source,
    value: bytes | None,
    key: bytes | None,
    headers: Iterable[tuple[str, bytes | None]],
    message_id: str | None = None,
    policy: Literal["truncate", "reject"] | None = None,
    pack: tuple[str, str] | None = None,
    model: ModelRef | None = None,
    max_value_bytes: int = MAX_DLQ_VALUE_BYTES,
) -> DeadLetterRecord:
    """The dead-letter record of one input record: the original bytes, their source, and why."""
    kept = value
    if value is not None and len(value) > max_value_bytes:
        kept = value[:max_value_bytes]
    return DeadLetterRecord(
        id=message_id,
        error=DeadLetterError(kind=kind, message=message, policy=policy),
        source=source,
        value_b64=_b64(kept),
        value_size=None if value is None else len(value),
        value_truncated=kept is not value,
        key_b64=_b64(key),
        headers=[Header(key=k, value_b64=_b64(v)) for k, v in headers or ()],
        pack=None if pack is None else {"name": pack[0], "version": pack[1]},
        model=model,
    )


def dead_letter_bytes(record: DeadLetterRecord) -> bytes:
    """The record's value on the dead-letter topic (compact JSON; ``null`` members kept)."""
    return orjson.dumps(record.model_dump(mode="json"))


def output_headers(
    input_headers: Sequence[tuple[str, bytes | None]] | None,
    *,
    pack_name: str,
    pack_version: str,
    model: ModelRef,
    error_kind: str | None = None,
) -> list[tuple[str, bytes]]:
    """Headers of a written record: ``spinf-pack`` (``name@version``), ``spinf-model`` (its name),
    ``spinf-device`` (``cpu``/``cuda``), ``spinf-dtype``, ``spinf-error-kind`` (dead letters only),
    then ``traceparent``/``tracestate`` from the input."""
    out = [
        ("spinf-pack", f"{pack_name}@{pack_version}".encode()),
        ("spinf-model", model.name.encode()),
        ("spinf-device", model.device.encode()),
        ("spinf-dtype", model.dtype.encode()),
    ]
    if error_kind is not None:
        out.append(("spinf-error-kind", error_kind.encode()))
    for k, v in input_headers or ():
        if k in PASSTHROUGH_HEADERS and v is not None:
            out.append((k, bytes(v)))
    return out
