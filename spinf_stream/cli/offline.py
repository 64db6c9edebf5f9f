"""``spinf-stream score``: score a JSON Lines file offline, one output line per input line.

Each input line goes through :func:`spinf_stream.messages.decode`, the decoder the service uses
for record values, so both accept and reject the same bytes. A bad line (undecodable bytes, not
JSON, not an object, a missing/empty/non-string field the pack uses) gets an error record in its
place and the rest are still scored. Records are written and flushed as each forward pass
finishes, in input order.

Exit codes: 0; 1 when no line could be scored (``--strict``: when any line could not); 2 for a
usage mistake (found before the model loads); 130 after Ctrl-C (the records of every finished
pass are kept).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, Literal

import orjson
from pydantic import Field
from pydantic_settings import BaseSettings

from spinf_stream.config import (
    LOG_LEVEL_HELP,
    DType,
    LogLevel,
    allow_unstable_bits_field,
    calibration_field,
    device_field,
    dtype_field,
    model_field,
    pack_field,
    plain,
    settings_config,
    token_budget_field,
)
from spinf_stream.errors import UsageError
from spinf_stream.messages import Decoded, InputFormat, Rejection, decode
from spinf_stream.engine.results import ErrorInfo, ErrorRecord
from spinf_stream.table import ResultsView

if TYPE_CHECKING:
    from spinf_stream.engine.scoring import Engine

log = logging.getLogger("spinf_stream.score")

#: Lines read and tokenized at a time (bounds memory; the engine then runs them pass by pass).
CHUNK_MESSAGES = 256
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def parse_line(
    raw: bytes, line_no: int, *, source: str = "-", input_format: InputFormat = "json", text_field: str = "text"
) -> Decoded | ErrorRecord:
    """One input line (without its line ending) → its fields and id, or the :class:`ErrorRecord`
    that takes its place.

    A line without an id (a line that cannot be read included) is named ``<source>:<line_no>``
    (``stdin:<line_no>`` for ``-``), as the service names a record without one
    ``<topic>:<partition>:<offset>``. Error kinds: those of
    :func:`spinf_stream.messages.decode`; the pack's fields are checked by the engine.
    """
    got = decode(raw, input_format=input_format, text_field=text_field)
    name = f"{'stdin' if source == '-' else source}:{line_no}"
    if isinstance(got, Rejection):
        return ErrorRecord(id=got.id or name, error=ErrorInfo(kind=got.kind, message=f"line {line_no}: {got.message}"))
    if got.id is None:
        return Decoded(got.fields, name)
    return got


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
def _open_out(path: str | None) -> Iterator[IO[bytes] | None]:
    if path is None:
        yield None
    elif path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
    else:
        with open(path, "wb") as f:
            yield f


@dataclass
class ScoreSummary:
    """What :func:`score_file` did: lines read, records written, errors by kind, time taken."""

    lines: int = 0
    written: int = 0
    scored: int = 0
    questions: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)  # kind -> its first message
    seconds: float = 0.0
    interrupted: bool = False

    def line(self, output: str | None) -> str:
        """The summary line printed at the end."""
        rate = ""
        if self.seconds > 0 and self.scored:
            rate = f", {self.scored / self.seconds:.1f} messages/s, {self.questions / self.seconds:.1f} questions/s"
        where = "no file (--output FILE writes the records)" if output is None else "stdout" if output == "-" else output
        n_err = sum(self.errors.values())
        head = f"interrupted after {self.written} of {self.lines} lines read: " if self.interrupted else ""
        return (
            f"{head}scored {self.scored} of {self.written} lines ({n_err} errors) in {self.seconds:.1f} s{rate}"
            f" -> {where}"
        )

    def failure(self) -> str:
        """Why no line could be scored: the commonest error kind and its first message."""
        if not self.errors:
            return "the input holds no line"
        kind, n = self.errors.most_common(1)[0]
        return f"{n} x {kind} ({self.first_error[kind]})"


def score_file(
    engine: Engine | Any,
    input_path: str,
    output_path: str | None,
    *,
    progress: bool = False,
    input_format: InputFormat = "json",
    text_field: str = "text",
    stop: Callable[[], bool] = lambda: False,
    view: ResultsView | None = None,
) -> ScoreSummary:
    """Score ``input_path`` into ``output_path`` (``-`` = stdin/stdout; ``None``: no records
    written, for a ``view`` alone), one line per line.

    Records are written and flushed after each forward pass (``engine.run_iter``), in input
    order. ``stop()`` is asked after each pass: once true, no further pass starts and the records
    written so far are all that is written. ``progress``: a bar on stderr (per message, with
    messages/s, questions/s and the ETA). ``view``: each record is also added to it, with the
    text of the message's ``text_field``.

    Raises:
        OSError: the input cannot be read or the output written.
    """
    from tqdm import tqdm

    total = None
    if progress and input_path != "-":
        with open(input_path, "rb") as f:
            total = sum(1 for _ in f)
    summary = ScoreSummary()
    start = time.perf_counter()
    bar = tqdm(total=total, unit="msg", disable=not progress, file=sys.stderr, dynamic_ncols=True)
    source = Path(input_path).name if input_path != "-" else "-"
    try:
        with _open_in(input_path) as fin, _open_out(output_path) as fout:

            def write(rec: Any, fields: dict[str, Any] | None) -> None:
                if isinstance(rec, ErrorRecord):
                    summary.errors[rec.error.kind] += 1
                    summary.first_error.setdefault(rec.error.kind, rec.error.message)
                    plain = rec.model_dump(exclude_none=True)
                else:
                    summary.scored += 1
                    summary.questions += len(rec.scores)
                    plain = rec.model_dump(mode="json")
                if fout is not None:
                    fout.write(orjson.dumps(plain) + b"\n")
                if view is not None:
                    value = (fields or {}).get(text_field)
                    view.add(plain, value if isinstance(value, str) else None)
                summary.written += 1

            def after_pass() -> bool:
                if fout is not None:
                    fout.flush()
                elapsed = max(time.perf_counter() - start, 1e-9)
                bar.set_postfix_str(f"{summary.questions / elapsed:.1f} q/s", refresh=False)
                bar.update(summary.written - bar.n)
                return stop()

            for chunk in _chunks(_lines(fin), CHUNK_MESSAGES):
                if stop():
                    summary.interrupted = True
                    break
                first = summary.lines + 1
                summary.lines += len(chunk)
                parsed = [
                    parse_line(raw, first + k, source=source, input_format=input_format, text_field=text_field)
                    for k, raw in enumerate(chunk)
                ]
                if _score_chunk(engine, parsed, write, after_pass):
                    summary.interrupted = True
                    break
                after_pass()
    except KeyboardInterrupt:  # a second Ctrl-C: what was flushed stays
        summary.interrupted = True
    finally:
        bar.close()
        summary.seconds = time.perf_counter() - start
    return summary


def _score_chunk(
    engine: Any, parsed: list[Decoded | ErrorRecord], write: Callable[[Any, dict[str, Any] | None], None],
    after_pass: Callable[[], bool],
) -> bool:
    """Score one chunk of parsed lines: each line's record is written in input order as soon as it
    exists (error records at once, score records as their pass finishes), with the line's fields
    (``None`` for a line that could not be read). ``after_pass()`` runs after each pass; when it
    returns true no further pass starts. Returns whether it stopped."""
    from spinf_stream.engine.scoring import Message

    todo = [Message(id=p.id, fields=p.fields) for p in parsed if isinstance(p, Decoded)]
    prepared = iter(engine.prepare(todo))
    pending = deque(next(prepared) if isinstance(p, Decoded) else p for p in parsed)
    fields = deque(p.fields if isinstance(p, Decoded) else None for p in parsed)
    ready = [p for p in pending if not isinstance(p, ErrorRecord)]

    def write_errors() -> None:  # the error records up to the next line that waits for a score
        while pending and isinstance(pending[0], ErrorRecord):
            write(pending.popleft(), fields.popleft())

    write_errors()
    passes = engine.run_iter(ready)
    try:
        for records in passes:
            for rec in records:
                pending.popleft()
                write(rec, fields.popleft())
                write_errors()
            if after_pass():
                return True
    finally:
        close = getattr(passes, "close", None)
        if close is not None:
            close()  # no pass starts after the one that finished
    return False


def _chunks(lines: Iterator[bytes], n: int) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _StopAfterPass:
    """SIGINT handler for the main thread: the first Ctrl-C asks to stop after the current forward
    pass (one notice line), a second one stops at once (``KeyboardInterrupt``)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __call__(self) -> bool:
        return self.requested

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("spinf-stream score: Ctrl-C: stopping after the current forward pass (again: at once)", file=sys.stderr, flush=True)

    def __enter__(self) -> _StopAfterPass:
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: Ctrl-C raises KeyboardInterrupt as usual
            self._previous = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class ScoreCommand(BaseSettings):
    """Score a JSON Lines file offline against a pack; one output line per input line, written as
    each forward pass finishes. Exit codes: 0; 1 no line could be scored (--strict: any line);
    2 usage mistake; 130 interrupted (finished records kept)."""

    model_config = settings_config()

    pack: str = pack_field()
    input: str = Field(description="Input JSON Lines file; '-' = stdin.", json_schema_extra=plain("FILE"))
    output: str | None = Field(
        None,
        description="Output JSON Lines file (replaced); '-' = stdout. Its directory is created if missing. "
        "Default: stdout, or no file when stdout shows the table.",
        json_schema_extra=plain("FILE"),
    )
    format: Literal["auto", "jsonl", "table"] = Field(
        "auto",
        description="What stdout shows: jsonl (the records), table (one row per message: id, text, answers; the "
        "records go to --output only), auto (table when stdout is a terminal, else jsonl).",
    )
    model: str = model_field()
    token_budget: int = token_budget_field()
    device: str = device_field()
    dtype: DType = dtype_field()
    calibration: str = calibration_field()
    allow_unstable_bits: bool = allow_unstable_bits_field()
    input_format: InputFormat = Field(
        "json",
        description="json: each line is a JSON object with the pack's fields (and an optional id); text: each line is the text of the pack's one field.",
    )
    special_tokens_in_fields: Literal["plain", "parse"] | None = Field(
        default=None,
        description="Special-token text in message fields: plain text, or parse it into control tokens "
        "(the tokenizer's default); default: the pack's special_tokens_in_fields (plain unless it says so).",
    )
    strict: bool = Field(default=False, description="Exit 1 if any line could not be scored (else only if none could).")
    progress: bool = Field(default=True, description="Progress bar on stderr when it is a terminal.")
    log_level: LogLevel = Field("INFO", description=LOG_LEVEL_HELP)

    def cli_cmd(self) -> None:
        from . import preflight
        from spinf_stream.device import choose

        logging.getLogger("spinf_stream").setLevel(self.log_level)
        # Everything that can be checked in a second, before the model loads; the model reference
        # last of the cheap ones (checking it imports torch).
        pack = preflight.check_pack(self.pack, self.input_format)
        text_field = pack.fields[0]
        table = self.format == "table" or (self.format == "auto" and self.output != "-" and sys.stdout.isatty())
        if table and self.output == "-":
            raise UsageError("--output - (SPINF_OUTPUT) with --format table: stdout shows the table; "
                             "give --output FILE for the records, or --format jsonl")
        output = self.output if self.output is not None or table else "-"
        preflight.check_input_file(self.input, "--input", "SPINF_INPUT")
        preflight.check_fields(pack, self.input, self.input_format)
        if output is not None:
            preflight.check_output_file(output, "--output", "SPINF_OUTPUT", input_path=self.input)
        preflight.check_calibration(self.calibration, pack)
        preflight.check_model_reference(self.model)
        placement = choose(self.device, self.dtype)

        from spinf_stream.engine.scoring import Engine

        engine = Engine.load(
            self.model, pack, token_budget=self.token_budget, dtype=placement.dtype, device=placement.device,
            special_tokens_in_fields=self.special_tokens_in_fields, calibration=self.calibration,
            allow_unstable_bits=self.allow_unstable_bits,
        )
        info = engine.model_info
        log.info("model %s (sha256 %s) on %s in %s, kernels %s", info.name, info.sha256, placement.device, info.dtype, info.kernels)
        view = ResultsView([q.id for q in pack.expand()], keep_rows=table)
        with _StopAfterPass() as stop:
            summary = score_file(
                engine, self.input, output, progress=self.progress and sys.stderr.isatty(),
                input_format=self.input_format, text_field=text_field, stop=stop, view=view,
            )
        if table:
            from rich.console import Console

            view.print(Console(), summary.seconds)
        else:
            for line in view.summary():
                print(f"spinf-stream score: {line}", file=sys.stderr)
        print(f"spinf-stream score: {summary.line(output)}", file=sys.stderr, flush=True)
        if summary.interrupted:
            raise SystemExit(EXIT_INTERRUPTED)
        if summary.lines and not summary.scored:
            print(f"spinf-stream score: error: no line could be scored: {summary.failure()}", file=sys.stderr)
            raise SystemExit(EXIT_FAILED)
        if self.strict and summary.errors:
            raise SystemExit(EXIT_FAILED)
