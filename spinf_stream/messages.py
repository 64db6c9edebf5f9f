"""Input bytes → a message's fields, or the reason they cannot be one.

The one decoder of both input paths: ``spinf-stream score`` hands it each line of a file (without
its line ending), the service each Kafka record value. Both therefore accept and reject exactly
the same bytes, with the same error kinds; they differ only in the default id they give a message
without one (``<file>:<line>`` offline, ``<topic>:<partition>:<offset>`` in the stream).

Two input formats:

- ``json``: UTF-8 JSON (RFC 8259, parsed by orjson: no ``NaN``/``Infinity``, no lone surrogates,
  nesting up to 1024 levels, a repeated key keeps its last value) whose top level is an object.
  Its members are the message's fields (the engine picks and checks the pack's). ``id`` is
  optional: a non-empty string or an integer (written as its decimal string); absent or ``null``
  means "no id".
- ``text``: the UTF-8 bytes are the text of one field (``text_field``, the pack's only field).
- ``image`` (the service only): the bytes are a picture (PNG, JPEG, WebP) in the pack's first
  field; the other fields, and ``id``, come from the record's ``spinf-fields`` header, a JSON
  object.

In both formats one leading UTF-8 byte order mark (``EF BB BF``) is dropped: Windows tools write
one at the start of a file, and it is never part of the content.

Rejection kinds: ``null_value`` (a Kafka tombstone), ``empty_value`` (zero bytes, e.g. a blank
line), ``invalid_utf8``, ``invalid_json``, ``not_an_object``, ``wrong_type`` / ``empty_field``
(``id``), ``too_long`` (over ``max_bytes``, unread). Messages say where and what, never quote the content (it may be private).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from .errors import UsageError

__all__ = ["BOM", "FIELDS_HEADER", "Decoded", "InputFormat", "Rejection", "StreamInputFormat", "decode", "has_visible_content", "json_type_name", "text_field"]

BOM = b"\xef\xbb\xbf"
InputFormat = Literal["json", "text"]
#: The service's input formats: also ``image``, a record value that is a picture's bytes
StreamInputFormat = Literal["json", "text", "image"]
#: With ``--input-format image``: the header holding the message's other fields (a JSON object)
FIELDS_HEADER = "spinf-fields"


@dataclass(frozen=True)
class Message:
    """One input message: its ``id`` and the raw JSON values of its fields."""

    id: str
    fields: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decoded:
    """A message's fields (raw JSON values) and its id, ``None`` when the input gave none."""

    fields: dict[str, Any]
    id: str | None


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why the bytes are no message: a machine-readable ``kind`` and a message without content."""

    kind: str
    message: str
    id: str | None = None


def json_type_name(value: Any) -> str:
    """The JSON name of a decoded value's type (``object``, ``array``, ``string``, ...)."""
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "number",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


#: Unicode categories of characters without visible content: spaces, format characters (zero
#: width joiners, bidi marks), combining marks with nothing to combine with, control characters.
INVISIBLE_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cf", "Mn", "Cc"})


def has_visible_content(text: str) -> bool:
    """Whether ``text`` (after NFC) holds a character outside :data:`INVISIBLE_CATEGORIES`.
    A text without one is an ``empty_field``, like a whitespace-only text."""
    for ch in text:  # fast path: real text has a visible character near its start
        if unicodedata.category(ch) not in INVISIBLE_CATEGORIES:
            return True
    return any(unicodedata.category(ch) not in INVISIBLE_CATEGORIES for ch in unicodedata.normalize("NFC", text))


def text_field(pack_fields: Sequence[str], pack_name: str = "the pack") -> str:
    """The field raw text fills with ``--input-format text``: the pack's only field.

    Raises:
        UsageError: the pack's prompt uses no field or several (it names them).
    """
    if len(pack_fields) != 1:
        used = ", ".join("{" + f + "}" for f in pack_fields) or "no field"
        raise UsageError(
            f"--input-format text (SPINF_INPUT_FORMAT) needs a pack whose prompt uses exactly one field; "
            f"{pack_name} uses {used}: use --input-format json with objects holding those fields"
        )
    return pack_fields[0]


def decode(
    value: bytes | None, *, input_format: StreamInputFormat = "json", text_field: str = "text",
    max_bytes: int | None = None, fields_header: bytes | None = None,
) -> Decoded | Rejection:
    """Decode one input (a line without its line ending, or a record value).

    ``max_bytes``: a longer value is ``too_long`` unread (the service's ``--max-message-bytes``).
    ``input_format`` ``image`` (the service only): the value is a picture's bytes, the field
    ``text_field``; the message's other fields (and its ``id``) are the JSON object of
    ``fields_header`` (the record's :data:`FIELDS_HEADER` header), if any.
    Never raises for bad input: returns a :class:`Rejection` (kinds in the module docstring).
    """
    if value is None:
        return Rejection("null_value", "a null value (a tombstone)")
    if max_bytes is not None and len(value) > max_bytes:
        return Rejection("too_long", f"the value is {len(value)} bytes, over --max-message-bytes {max_bytes}")
    if input_format == "image":
        return _picture_record(bytes(value), text_field, fields_header)
    raw = bytes(value)
    if raw.startswith(BOM):
        raw = raw[len(BOM) :]
    if not raw:
        return Rejection("empty_value", "empty (0 bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Rejection("invalid_utf8", f"not valid UTF-8 ({e.reason} at byte {e.start})")
    if input_format == "text":
        return Decoded({text_field: text}, None)
    obj = _json_object(text)
    return obj if isinstance(obj, Rejection) else _with_id(obj)


def _json_object(text: str | bytes, subject: str = "") -> dict[str, Any] | Rejection:
    """The JSON object ``text`` holds, or why it is none (``subject`` names it in the message)."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        return Rejection("invalid_json", f"{subject} is not JSON ({e.msg} at char {e.pos})" if subject
                         else f"not JSON ({e.msg} at char {e.pos})")
    if not isinstance(obj, dict):
        what = f"a JSON {json_type_name(obj)}, not an object"
        return Rejection("not_an_object", f"{subject} is {what}" if subject else what)
    return obj


def _with_id(fields: dict[str, Any], extra: Mapping[str, Any] | None = None) -> Decoded | Rejection:
    """``fields`` (and ``extra``) as a message with the ``id`` they give, or why that is no id."""
    message_id = read_id(fields)
    if isinstance(message_id, Rejection):
        return message_id
    return Decoded({**fields, **extra} if extra else fields, message_id)


def _picture_record(value: bytes, field: str, fields_header: bytes | None) -> Decoded | Rejection:
    """``--input-format image``: the picture in ``field``, the other fields from the header."""
    if not value:
        return Rejection("empty_value", "empty (0 bytes)")
    fields = {} if fields_header is None else _json_object(fields_header, f"the {FIELDS_HEADER} header")
    return fields if isinstance(fields, Rejection) else _with_id(fields, {field: value})


def read_id(obj: Mapping[str, Any]) -> str | None | Rejection:
    """A decoded object's ``id`` (a string or an integer, as a string), ``None`` when it has none,
    or why it cannot be one (``wrong_type``, ``empty_field``)."""
    raw_id = obj.get("id")
    if raw_id is None:
        return None
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        return Rejection("wrong_type", f"field 'id' must be a string or an integer, got a JSON {json_type_name(raw_id)}")
    message_id = str(raw_id)
    if not message_id.strip():
        return Rejection("empty_field", "field 'id' is empty")
    return message_id
