"""Log output: ``--log-format text`` (one human line per event) or ``json`` (one object per line).

A JSON line holds ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger``, ``message``, and
the structured fields a call passed with ``extra=`` (``partition``, ``offset``, ``batch_messages``,
the status line's counters, ...); an exception adds ``exception`` (its traceback). The service never
passes message content, keys or ids to a log call, in either format.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone
from typing import Any, Literal

import orjson

LogFormat = Literal["text", "json"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then the ``extra=`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str, fmt: LogFormat = "text") -> None:
    """Log ``spinf_stream`` at ``level`` to stderr in ``fmt`` (aiokafka at WARNING unless DEBUG).

    ``json`` replaces the root handlers with one stderr handler, so every line is an object;
    ``text`` keeps a handler already installed (the console script installs one) or adds one.
    """
    root = logging.getLogger()
    if fmt == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        for h in list(root.handlers):
            root.removeHandler(h)
        root.addHandler(handler)
    elif not root.handlers:
        logging.basicConfig(stream=sys.stderr, format=TEXT_FORMAT)
    logging.getLogger("spinf_stream").setLevel(level)
    logging.getLogger("aiokafka").setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
