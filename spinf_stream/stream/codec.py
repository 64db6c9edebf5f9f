"""Decode an input record's bytes into a message for the engine, or say why it cannot be one.

The bytes go through :func:`spinf_stream.messages.decode`, the decoder ``spinf-stream score``
uses too, so the service and the offline command accept and reject exactly the same input
(``--input-format json|text``; see that module for the rules and the rejection kinds). What the
stream adds: a message without an id is named ``topic:partition:offset``, a record may ask
for a pack in a ``spinf-pack`` header, and a record the Kafka client could not parse
(:class:`~spinf_stream.stream.fetch_guard.UndecodableRecord`) is ``undecodable_record``.

Error messages never quote the content (it may be private); they say where and what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka.structs import ConsumerRecord

from spinf_stream.messages import FIELDS_HEADER, Rejection, StreamInputFormat, decode
from spinf_stream.stream.fetch_guard import UndecodableRecord

__all__ = [
    "PACK_HEADER", "TEXT_FIELD", "Decoded", "Rejection", "check_pack_header", "decode_record", "decode_value", "default_id",
]

TEXT_FIELD = "text"
PACK_HEADER = "spinf-pack"


@dataclass(frozen=True, slots=True)
class Decoded:
    """A message ready for :meth:`Engine.prepare`: its id and its fields (raw JSON values)."""

    id: str
    fields: dict[str, Any]
    id_given: bool  # False when id is the default topic:partition:offset


def default_id(topic: str, partition: int, offset: int) -> str:
    return f"{topic}:{partition}:{offset}"


def decode_value(
    value: bytes | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    input_format: StreamInputFormat = "json",
    text_field: str = TEXT_FIELD,
    max_bytes: int | None = None,
    fields_header: bytes | None = None,
) -> Decoded | Rejection:
    """Decode one record value (``text_field``: the field raw text fills with ``--input-format
    text``, a picture's bytes with ``image``, whose other fields are ``fields_header``'s;
    ``max_bytes``: a longer value is ``too_long``, unread). Never raises for bad input: returns
    a :class:`Rejection`."""
    got = decode(value, input_format=input_format, text_field=text_field, max_bytes=max_bytes,
                 fields_header=fields_header)
    if isinstance(got, Rejection):
        return got
    if got.id is None:
        return Decoded(default_id(topic, partition, offset), got.fields, id_given=False)
    return Decoded(got.id, got.fields, id_given=True)


def check_pack_header(
    headers: Any, *, pack_name: str, pack_version: str
) -> Rejection | None:
    """A record may name the pack it wants in a ``spinf-pack`` header (``name`` or ``name@version``).

    Returns a ``unknown_pack`` rejection when that is not the pack this scorer runs, else ``None``.
    """
    for key, raw in headers or ():
        if key != PACK_HEADER:
            continue
        try:
            wanted = (raw or b"").decode("utf-8").strip()
        except UnicodeDecodeError:
            return Rejection("unknown_pack", "the spinf-pack header is not valid UTF-8")
        name, _, version = wanted.partition("@")
        if name != pack_name or (version and version != pack_version):
            return Rejection(
                "unknown_pack",
                f"the record asks for pack {wanted[:200]!r}; this scorer runs {pack_name}@{pack_version}",
            )
    return None


def decode_record(
    rec: ConsumerRecord[bytes, bytes] | UndecodableRecord,
    *,
    input_format: StreamInputFormat,
    text_field: str,
    max_bytes: int | None,
    pack_name: str | None = None,
    pack_version: str | None = None,
) -> Decoded | Rejection:
    """The message of one consumed record (:func:`decode_value`), or why it is none: also
    ``undecodable_record`` and, given ``pack_name``, ``unknown_pack`` (:func:`check_pack_header`;
    the rejection keeps the id the value gave, if any; the service routes by the header instead,
    :mod:`~spinf_stream.stream.routing`). Never raises for bad input."""
    if isinstance(rec, UndecodableRecord):
        return Rejection("undecodable_record", f"the Kafka client cannot parse this record: {rec.reason}")
    fields_header = None
    if input_format == "image":
        fields_header = next((v for k, v in rec.headers or () if k == FIELDS_HEADER and v is not None), None)
    decoded = decode_value(
        rec.value, topic=rec.topic, partition=rec.partition, offset=rec.offset,
        input_format=input_format, text_field=text_field, max_bytes=max_bytes, fields_header=fields_header,
    )
    if pack_name is None:
        return decoded
    wrong_pack = check_pack_header(rec.headers, pack_name=pack_name, pack_version=pack_version or "")
    if wrong_pack is not None:
        given = decoded.id if isinstance(decoded, Decoded) and decoded.id_given else None
        return Rejection(wrong_pack.kind, wrong_pack.message, given)
    return decoded
