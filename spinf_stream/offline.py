"""``spinf-stream score``: score a JSON Lines file offline, one output line per input line.

Input lines are JSON objects with ``id`` and the fields the pack uses. A bad line (undecodable
bytes, not JSON, not an object, missing/empty/non-string field) gets an error record in its place
and the rest are still scored; the exit code is 0 unless ``--strict``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO, Literal

import orjson
from pydantic import BaseModel, Field

from .engine import DEFAULT_TOKEN_BUDGET, Engine, Message
from .records import ErrorInfo, ErrorRecord, ScoreRecord

#: Messages handed to the engine at a time: bounds memory and paces the progress bar.
CHUNK_MESSAGES = 256


def parse_line(raw: bytes, line_no: int) -> Message | ErrorRecord:
    """One input line → a :class:`Message`, or the :class:`ErrorRecord` that takes its place.

    Error kinds: ``invalid_utf8``, ``invalid_json``, ``not_an_object``, ``missing_field`` /
    ``wrong_type`` / ``empty_field`` (for ``id``; the pack's fields are checked by the engine).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return ErrorRecord(error=ErrorInfo(kind="invalid_utf8", message=f"line {line_no}: not UTF-8 ({e.reason} at byte {e.start})"))
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        return ErrorRecord(error=ErrorInfo(kind="invalid_json", message=f"line {line_no}: not JSON ({e})"))
    if not isinstance(obj, dict):
        return ErrorRecord(error=ErrorInfo(kind="not_an_object", message=f"line {line_no}: a JSON {type(obj).__name__}, not an object"))
    mid = obj.get("id")
    if mid is None:
        return ErrorRecord(error=ErrorInfo(kind="missing_field", message=f"line {line_no}: field 'id' is missing"))
    if isinstance(mid, bool) or not isinstance(mid, (str, int)):
        return ErrorRecord(error=ErrorInfo(kind="wrong_type", message=f"line {line_no}: field 'id' must be a string or an integer"))
    mid = str(mid)
    if not mid.strip():
        return ErrorRecord(error=ErrorInfo(kind="empty_field", message=f"line {line_no}: field 'id' is empty"))
    return Message(id=mid, fields=obj)


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    for raw in stream:
        yield raw.rstrip(b"\r\n")


@contextmanager
def _open_in(path: str) -> Iterator[BinaryIO]:
    if path == "-":
        yield sys.stdin.buffer
    else:
        with open(path, "rb") as f:
            yield f


@contextmanager
def _open_out(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
    else:
        with open(path, "wb") as f:
            yield f


def score_file(engine: Engine, input_path: str, output_path: str, *, progress: bool = True) -> tuple[int, int]:
    """Score ``input_path`` into ``output_path`` (``-`` = stdin/stdout).

    Returns:
        ``(lines, errors)`` counts.
    Raises:
        OSError: the input cannot be read or the output written.
    """
    from tqdm import tqdm

    total = None
    if input_path != "-" and progress:
        with open(input_path, "rb") as f:
            total = sum(1 for _ in f)
    n = errors = 0
    with _open_in(input_path) as fin, _open_out(output_path) as fout:
        bar = tqdm(total=total, unit="msg", disable=not progress or input_path == "-", file=sys.stderr)
        chunk: list[Message | ErrorRecord] = []

        def flush() -> None:
            nonlocal errors
            msgs = [c for c in chunk if isinstance(c, Message)]
            done = iter(engine.score(msgs))
            for c in chunk:
                rec: ScoreRecord | ErrorRecord = next(done) if isinstance(c, Message) else c
                if isinstance(rec, ErrorRecord):
                    errors += 1
                    fout.write(orjson.dumps(rec.model_dump(exclude_none=True)) + b"\n")
                else:
                    fout.write(orjson.dumps(rec.model_dump()) + b"\n")
            fout.flush()
            bar.update(len(chunk))
            chunk.clear()

        for raw in _lines(fin):
            n += 1
            chunk.append(parse_line(raw, n))
            if len(chunk) >= CHUNK_MESSAGES:
                flush()
        if chunk:
            flush()
        bar.close()
    return n, errors


class ScoreCommand(BaseModel):
    """Score a JSON Lines file offline against a pack; one output line per input line."""

    pack: str = Field(description="pack file (packs/spam.yaml) or name of a shipped pack (spam)")
    input: str = Field(description="input JSON Lines file; '-' = stdin")
    output: str = Field(description="output JSON Lines file; '-' = stdout")
    model: str = Field(
        default="qwen2.5-coder-0.5b",
        description="model: gemma-3-270m, smollm2-135m, qwen2.5-coder-0.5b, a Hugging Face directory or a .gguf file",
    )
    token_budget: int = Field(default=DEFAULT_TOKEN_BUDGET, ge=1, description="tokens per forward pass")
    device: str = Field(default="cpu", description="torch device: cpu or cuda (cuda runs the Triton kernels)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(default="float32", description="weights and activations dtype")
    calibration: str = Field(
        default="auto", description="calibration file, auto (the pack's shipped one for this model, if any) or none"
    )
    strict: bool = Field(default=False, description="exit 1 if any line could not be scored")
    progress: bool = Field(default=True, description="progress bar on stderr (files only)")

    def cli_cmd(self) -> None:
        import torch

        engine = Engine.load(
            self.model, self.pack, token_budget=self.token_budget, dtype=getattr(torch, self.dtype), device=self.device,
            calibration=self.calibration,
        )
        if self.output != "-":
            Path(self.output).parent.mkdir(parents=True, exist_ok=True)
        n, errors = score_file(engine, self.input, self.output, progress=self.progress)
        print(f"scored {n - errors} of {n} lines ({errors} errors)", file=sys.stderr)
        if self.strict and errors:
            raise SystemExit(1)
