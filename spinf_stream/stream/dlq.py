"""Build dead-letter records, sized to fit, and the Kafka headers of everything the scorer writes.

A dead letter keeps the input record whole when it fits the size the producer sends
(``max.request.size``) and the topic accepts (``max.message.bytes``). When it does not, it keeps a
prefix of the value, of the key and of the headers, and says in ``cut`` what was cut, with each
part's full size and sha256. The size that counts is aiokafka's own estimate of the written record
(value, key and headers, with the batch overhead), the one its producer refuses a record by.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import orjson
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from spinf_stream.engine.results import ModelRef
from spinf_stream.stream.records import Cut, DeadLetterError, DeadLetterRecord, Header, Source

#: Kafka's default ``max.request.size`` (producer) and about its ``max.message.bytes`` (topic).
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024

#: Input headers copied onto the records the scorer writes (W3C trace context), and the longest
#: value of each that is copied (W3C: ``traceparent`` is 55 characters, ``tracestate`` at most 512).
PASSTHROUGH_HEADERS = {"traceparent": 128, "tracestate": 512}

#: Room kept below the limit for what the estimate cannot see (digits of the sizes in ``cut``).
_SLACK = 256

RawHeader = tuple[str | bytes, bytes | None]


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> int:
    """Bytes a record takes in a produce request: aiokafka's upper-bound estimate (batch header,
    record overhead, key, value, headers), the size its producer checks ``max_request_size`` by."""
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, list(headers))


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _key_text(key: str | bytes) -> tuple[str, str | None]:
    """A header key as text, and its bytes in base64 when they are not UTF-8."""
    if isinstance(key, str):
        return key, None
    try:
        return key.decode("utf-8"), None
    except UnicodeDecodeError:
        return key.decode("utf-8", "backslashreplace"), _b64(key)


def _key_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")


def headers_sha256(headers: Sequence[RawHeader]) -> str:
    """sha256 of headers: each key's and value's bytes after its length, 4 bytes big-endian
    (``0xFFFFFFFF`` for a null value)."""
    h = hashlib.sha256()
    for k, v in headers:
        kb = _key_bytes(k)
        h.update(len(kb).to_bytes(4, "big") + kb)
        h.update(b"\xff\xff\xff\xff" if v is None else len(v).to_bytes(4, "big") + v)
    return h.hexdigest()


def _headers_size(headers: Sequence[RawHeader]) -> int:
    return sum(len(_key_bytes(k)) + (len(v) if v is not None else 0) for k, v in headers)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead letter ready to write: its ``record``, the record's JSON ``value`` and the Kafka
    ``key`` to write it under (the input key, or the prefix the record keeps of it)."""

    record: DeadLetterRecord
    value: bytes
    key: bytes | None


def dead_letter(
    *,
    kind: str,
    message: str,
    source: Source,
    value: bytes | None,
    key: bytes | None,
    headers: Iterable[RawHeader] | None,
    message_id: str | None = None,
    policy: Literal["truncate", "reject"] | None = None,
    pack: tuple[str, str] | None = None,
    model: ModelRef | None = None,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    out_headers: Sequence[tuple[str, bytes | None]] = (),
) -> DeadLetter:
    """The dead letter of one input record: the original bytes, their source, and why; cut to fit.

    Args:
        max_bytes: the largest record the producer and topic accept (:func:`record_size` of the
            written record, with ``out_headers``, stays at or below it).
        out_headers: the headers the dead letter is written with (see :func:`output_headers`).

    Raises:
        ValueError: ``max_bytes`` leaves no room even for a dead letter without any input bytes.
    """
    all_headers = list(headers or ())

    def build(v: bytes | None, k: bytes | None, n_headers: int, cuts: list[Cut]) -> DeadLetter:
        kept = []
        for hk, hv in all_headers[:n_headers]:
            text, raw = _key_text(hk)
            kept.append(Header(key=text, key_b64=raw, value_b64=_b64(hv)))
        record = DeadLetterRecord(
            id=message_id,
            error=DeadLetterError(kind=kind, message=message, policy=policy),
            source=source,
            value_b64=_b64(v),
            value_size=None if value is None else len(value),
            value_truncated=v is not value,
            key_b64=_b64(k),
            headers=kept,
            cut=cuts,
            pack=None if pack is None else {"name": pack[0], "version": pack[1]},
            model=model,
        )
        return DeadLetter(record, dead_letter_bytes(record), k)

    def size(d: DeadLetter) -> int:
        return record_size(d.key, d.value, out_headers)

    whole = build(value, key, len(all_headers), [])
    if size(whole) <= max_bytes:
        return whole

    cuts_all = []
    if value:
        cuts_all.append(Cut(part="value", size=len(value), kept=0, sha256=hashlib.sha256(value).hexdigest()))
    if key:
        cuts_all.append(Cut(part="key", size=len(key), kept=0, sha256=hashlib.sha256(key).hexdigest()))
    if all_headers:
        cuts_all.append(Cut(part="headers", size=_headers_size(all_headers), kept=0, count=len(all_headers),
                            sha256=headers_sha256(all_headers)))
    bare = build(value[:0] if value is not None else None, key[:0] if key is not None else None, 0, cuts_all)
    room = max_bytes - size(bare) - _SLACK
    if room < 0:
        raise ValueError(f"a dead letter needs more than {max_bytes} bytes even without the input's bytes")

    # Shares of the room: the key (written twice: as the record key and base64 in the body, 7/3
    # bytes per byte) up to an eighth, the headers up to a quarter, the value the rest (4/3).
    key_keep = 0 if not key else min(len(key), room // 8 * 3 // 7)
    header_room, n_headers = room // 4, 0
    for hk, hv in all_headers:
        cost = 40 + 6 * len(_key_bytes(hk)) + (len(hv) * 4 // 3 + 4 if hv is not None else 0)
        if cost > header_room:
            break
        header_room -= cost
        n_headers += 1
    used = (key_keep * 7 // 3 + 4) + (room // 4 - header_room)
    value_keep = 0 if not value else max(0, min(len(value), (room - used) * 3 // 4))
    for _ in range(8):
        cuts = []
        for c in cuts_all:
            if c.part == "value" and value_keep < c.size:
                cuts.append(c.model_copy(update={"kept": value_keep}))
            elif c.part == "key" and key_keep < c.size:
                cuts.append(c.model_copy(update={"kept": key_keep}))
            elif c.part == "headers" and n_headers < len(all_headers):
                cuts.append(c.model_copy(update={"kept": n_headers}))
        v = value if value is None or value_keep >= len(value) else value[:value_keep]
        k = key if key is None or key_keep >= len(key) else key[:key_keep]
        got = build(v, k, n_headers, cuts)
        over = size(got) - max_bytes
        if over <= 0:
            return got
        # not expected (the shares leave room): give up value bytes first, then the rest
        if value_keep:
            value_keep = max(0, value_keep - (over * 3 // 4 + 64))
        else:
            key_keep, n_headers = 0, 0
    return bare


def dead_letter_bytes(record: DeadLetterRecord) -> bytes:
    """The record's value on the dead-letter topic (compact JSON; ``null`` members kept)."""
    return orjson.dumps(record.model_dump(mode="json"))


def output_headers(
    input_headers: Sequence[RawHeader] | None,
    *,
    pack_name: str | None,
    pack_version: str | None,
    model: ModelRef | None,
    error_kind: str | None = None,
) -> list[tuple[str, bytes]]:
    """Headers of a written record: ``spinf-pack`` (``name@version``), ``spinf-model`` (its name),
    ``spinf-device`` (``cpu``/``cuda``), ``spinf-dtype`` (each left out when the record has no
    pack or model: a dead letter of a record no pack read), ``spinf-error-kind`` (dead letters
    only), then ``traceparent``/``tracestate`` from the input (dropped when longer than the W3C
    sizes)."""
    out: list[tuple[str, bytes]] = []
    if pack_name is not None:
        out.append(("spinf-pack", f"{pack_name}@{pack_version}".encode()))
    if model is not None:
        out += [
            ("spinf-model", model.name.encode()),
            ("spinf-device", model.device.encode()),
            ("spinf-dtype", model.dtype.encode()),
        ]
    if error_kind is not None:
        out.append(("spinf-error-kind", error_kind.encode()))
    for k, v in input_headers or ():
        if isinstance(k, str) and k in PASSTHROUGH_HEADERS and v is not None and len(v) <= PASSTHROUGH_HEADERS[k]:
            out.append((k, bytes(v)))
    return out
