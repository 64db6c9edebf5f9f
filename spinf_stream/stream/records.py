"""Records the stream writes: the score record with its source, and the dead-letter record.

The service builds each record it writes as one of these models and writes its
``model_dump(mode="json")`` as compact JSON (:mod:`~spinf_stream.stream.writer`,
:mod:`~spinf_stream.stream.dlq`). ``schemas/stream_score.schema.json`` and
``schemas/dlq.schema.json`` are generated from these models by :func:`write_stream_schemas`
(``python -m spinf_stream.stream.records [DIR]``); a test keeps them in sync.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from spinf_stream.engine.results import ErrorInfo, ModelRef, ScoreRecord


class Source(BaseModel):
    """Where the input record was read: its topic, partition, offset and timestamp."""

    model_config = ConfigDict(extra="forbid")
    topic: str
    partition: int = Field(ge=0)
    offset: int = Field(ge=0)
    timestamp: int | None = Field(description="The input record's timestamp, milliseconds since the Unix epoch.")


class Truncation(BaseModel):
    """Present when ``--too-long truncate`` cut a field to fit the model: what was scored."""

    model_config = ConfigDict(extra="forbid")
    policy: Literal["truncate"] = "truncate"
    field: str = Field(description="The field that was cut (a prefix of it was scored).")
    original_chars: int = Field(ge=0)
    kept_chars: int = Field(ge=0)


class StreamScoreRecord(ScoreRecord):
    """A score record on the scores topic: the offline ``score`` record plus its ``source``.

    ``scores`` and ``digest`` are exactly those of ``spinf-stream score`` for the same message.
    """

    model_config = ConfigDict(extra="forbid", title="StreamScoreRecord")
    source: Source
    truncated: Truncation | None = Field(
        None, exclude_if=lambda v: v is None, description="Only present when the text was truncated to fit."
    )


class Header(BaseModel):
    """One Kafka record header of the input record (keys may repeat)."""

    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="The header key; a key that is not UTF-8 is shown with \\xNN escapes (see key_b64).")
    key_b64: str | None = Field(None, description="Only for a key that is not UTF-8: its bytes, base64.")
    value_b64: str | None = Field(description="The header value, base64 (standard alphabet, padded); null for a null value.")


class Cut(BaseModel):
    """A part of the input record that the dead letter holds only a prefix of, so that the dead
    letter fits the producer's and the topic's size limits."""

    model_config = ConfigDict(extra="forbid")
    part: Literal["value", "key", "headers"]
    size: int = Field(ge=0, description="Bytes of the whole part (headers: keys and values together).")
    kept: int = Field(ge=0, description="What the dead letter keeps of it: bytes (value, key) or headers (headers).")
    count: int | None = Field(None, ge=0, description="headers only: how many the input record had.")
    sha256: str = Field(
        description="sha256 (hex) of the whole part: its bytes; for headers, of each header's key and value "
        "bytes, each preceded by its length as 4 bytes big-endian (0xFFFFFFFF for a null value)."
    )


class DeadLetterError(ErrorInfo):
    """Why the message went to the dead-letter topic.

    ``kind`` (machine-readable, the same names as ``spinf-stream score``'s error records):
    ``invalid_utf8`` (bytes are not UTF-8), ``invalid_json``, ``not_an_object`` (JSON but not an
    object), ``null_value`` (tombstone), ``empty_value`` (zero
    bytes), ``missing_field`` / ``wrong_type`` / ``empty_field`` (a field the pack uses, or ``id``),
    ``too_long`` (the text does not fit the model, or the value exceeds ``--max-message-bytes``;
    see ``policy``), ``too_slow`` (preparing the message took longer than
    ``--max-prepare-s``), ``unknown_pack`` (the record's ``spinf-pack`` header asks for a pack
    its route does not score), ``no_route`` (no route of ``--routes`` takes the record's topic and
    headers), ``model_load_failed`` (the pack's model could not be loaded), ``undecodable_record`` (the Kafka client could not parse the record:
    a header key that is not UTF-8, a corrupt batch, an unknown compression codec),
    ``record_too_large`` (the score record would exceed the size the producer or topic accepts),
    ``invalid_image`` / ``image_too_large`` (a picture or video field that cannot be read, or is
    over a limit), ``unsupported_image`` (pictures for a model that reads text only),
    ``engine_error`` (the engine failed on this message alone), or another kind the engine reports.
    """

    model_config = ConfigDict(extra="forbid")
    policy: Literal["truncate", "reject"] | None = Field(
        None, description="The --too-long policy in force (only for kind too_long)."
    )


class DeadLetterRecord(BaseModel):
    """A record on the dead-letter topic: the original bytes, where they came from, and why."""

    model_config = ConfigDict(extra="forbid", title="DeadLetterRecord")
    id: str | None = Field(None, description="The message id, when one could be read.")
    error: DeadLetterError
    source: Source
    value_b64: str | None = Field(description="The input record's value, base64; null for a tombstone.")
    value_size: int | None = Field(None, ge=0, description="Bytes in the input value (null for a tombstone).")
    value_truncated: bool = Field(
        False, description="True when value_b64 holds only the first bytes of an oversized value."
    )
    key_b64: str | None = Field(description="The input record's key, base64; null when it had none.")
    headers: list[Header] = Field(default_factory=list)
    cut: list[Cut] = Field(
        default_factory=list,
        description="The parts of the input record kept only in part (a prefix), with their full sizes and sha256; empty when the dead letter holds the whole record.",
    )
    pack: dict[str, str] | None = Field(None, description="The pack this dead letter is for: {name, version}; null for a record no pack read whose route has several.")
    model: ModelRef | None = Field(None, description="That pack's model, and how it runs (device, dtype, kernels); null with pack.")


SCHEMA_FILES: dict[str, type[BaseModel]] = {
    "stream_score.schema.json": StreamScoreRecord,
    "dlq.schema.json": DeadLetterRecord,
}


def stream_schemas() -> dict[str, dict[str, Any]]:
    """``{file name: JSON Schema}`` of the stream's records (draft 2020-12, from pydantic)."""
    out = {}
    for name, model in SCHEMA_FILES.items():
        schema = model.model_json_schema()
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        out[name] = schema
    return out


def write_stream_schemas(directory: str | Path) -> list[Path]:
    """Write :func:`stream_schemas` into ``directory`` (indent 2, trailing newline); returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in stream_schemas().items():
        path = directory / name
        path.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":  # python -m spinf_stream.stream.records [DIR]
    for p in write_stream_schemas(sys.argv[1] if len(sys.argv) > 1 else "schemas"):
        print(p)
