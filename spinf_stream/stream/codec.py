"""Decode an input record's bytes into a message for the engine, or say why it cannot be one.

Two input formats (``--input-format``):

- ``json``: the value is a UTF-8 JSON object; its members are the message's fields (the engine
  picks the pack's fields and checks them). ``id`` is optional: a non-empty string or an integer
  (as ``spinf-stream score`` takes it), or absent/null for the default ``topic:partition:offset``.
- ``text``: the value is raw UTF-8 text, the message's ``text`` field.

Error messages never quote the content (it may be private); they say where and what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

TEXT_FIELD = "text"
PACK_HEADER = "spinf-pack"


@dataclass(frozen=True, slots=True)
class Decoded:
    """A message ready for :meth:`Engine.prepare`: its id and its fields (raw JSON values)."""

    id: str
    fields: dict[str, Any]
    id_given: bool  # False when id is the default topic:partition:offset


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record cannot be scored; ``kind`` is a dead-letter kind (see ``records.DeadLetterError``)."""

    kind: str
    message: str
    id: str | None = None


def default_id(topic: str, partition: int, offset: int) -> str:
    return f"{topic}:{partition}:{offset}"


def _type_name(value: Any) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def decode_value(
    value: bytes | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    input_format: Literal["json", "text"] = "json",
) -> Decoded | Rejection:
    """Decode one record value. Never raises for bad input: returns a :class:`Rejection`."""
    fallback_id = default_id(topic, partition, offset)
    if value is None:
        return Rejection("null_value", "the record has a null value (a tombstone)")
    if len(value) == 0:
        return Rejection("empty_value", "the record value is empty (0 bytes)")
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        return Rejection("invalid_utf8", f"the value is not valid UTF-8: {e.reason} at byte {e.start}")

    if input_format == "text":
        return Decoded(fallback_id, {TEXT_FIELD: text}, id_given=False)

    if text.startswith("\ufeff"):  # a UTF-8 byte order mark: harmless, drop it
        text = text[1:]
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        return Rejection("invalid_json", f"the value is not JSON: {e.msg} at char {e.pos}")
    if not isinstance(obj, dict):
        return Rejection("not_an_object", f"the value is a JSON {_type_name(obj)}, not an object")

    raw_id = obj.get("id")
    if raw_id is None:
        return Decoded(fallback_id, obj, id_given=False)
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        return Rejection("wrong_type", f"field 'id' must be a string or an integer, got a JSON {_type_name(raw_id)}")
    message_id = str(raw_id)
    if not message_id.strip():
        return Rejection("empty_field", "field 'id' is empty")
    return Decoded(message_id, obj, id_given=True)


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
