"""Writes ``schemas/`` from the pydantic models of every record and of the HTTP API.

The JSON Schemas of every record the project emits (``python -m spinf_stream.schemas [DIR]``;
``tests/test_schemas.py`` keeps the committed files in sync)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spinf_stream.engine.results import record_schemas
from .input_schema import input_schemas
from .stream.records import stream_schemas


def all_schemas() -> dict[str, dict[str, Any]]:
    """File name → JSON Schema, engine records, stream records and the input message; and the
    HTTP API's OpenAPI document (``openapi.json``)."""
    from spinf_stream.api.app import openapi_document

    return {**record_schemas(), **stream_schemas(), **input_schemas(), "openapi.json": openapi_document()}


def render(schema: dict[str, Any]) -> str:
    """The committed text of one schema (indent 2, trailing newline)."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def write_schemas(directory: str | Path) -> list[Path]:
    """Write :func:`all_schemas` into ``directory``; returns the paths written."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in all_schemas().items():
        (d / name).write_text(render(schema), encoding="utf-8")
        paths.append(d / name)
    return paths


if __name__ == "__main__":
    for path in write_schemas(sys.argv[1] if len(sys.argv) > 1 else "schemas"):
        print(path)
