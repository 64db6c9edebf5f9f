"""The stream's subcommands of ``spinf-stream`` as pydantic-settings models (``cli_cmd`` runs one).

``spinf_stream.cli`` mounts them as ``run``, ``dev``, ``serve``, ``produce`` and ``consume``; each can also be
run alone with ``pydantic_settings.CliApp.run(RunCommand)``. Each ``cli_cmd`` ends the process
with its exit code (``SystemExit``) when that code is not 0.
"""

from __future__ import annotations

import asyncio
import sys

from spinf_stream.config import ConsumeSettings, DevSettings, ProduceSettings, RunSettings, ServeSettings


def _exit(code: int) -> None:
    if code:
        raise SystemExit(code)


class RunCommand(RunSettings):
    """Score Kafka topics: every input record gets a score record (output topic) or a dead-letter
    record (DLQ topic); offsets are committed once those are acknowledged. SIGTERM/SIGINT drain,
    write, commit and exit 0."""

    def cli_cmd(self) -> None:
        from spinf_stream.stream.app import run_scorer

        _exit(run_scorer(self))


class DevCommand(DevSettings):
    """Run the scorer on an embedded Kafka-compatible broker (Tansu, memory storage, loopback):
    creates the topics, optionally publishes --input, prints the records it writes."""

    def cli_cmd(self) -> None:
        from spinf_stream.stream.dev import run_dev

        _exit(run_dev(self))


class ServeCommand(ServeSettings):
    """Serve the HTTP scoring API alone, no Kafka (POST /v1/score, GET /v1/packs, /v1/models,
    /openapi.json): the pack and model as for score. SIGTERM/SIGINT finish the requests in flight."""

    def cli_cmd(self) -> None:
        from spinf_stream.api.serve import run_serve

        _exit(run_serve(self))


class ProduceCommand(ProduceSettings):
    """Publish a JSON-lines file (or stdin) to a topic, one record per line."""

    def cli_cmd(self) -> None:
        from spinf_stream.cli.preflight import check_input_file
        from spinf_stream.stream.app import configure_logging
        from spinf_stream.stream.topic_checks import check_topic, run_check
        from spinf_stream.stream.produce import lines_of, produce_lines

        configure_logging(self.log_level)
        check_input_file(self.input, "--input", "SPINF_INPUT")
        if self.input == "-":
            lines = lines_of(sys.stdin.buffer)
        else:
            with open(self.input, "rb") as f:
                lines = lines_of(f)
        if self.validate_json and str(self.input).endswith(".jsonl"):
            _check_json_objects(lines, self.input)
        run_check(check_topic(self, self.topic))
        metas = asyncio.run(produce_lines(self.client_kwargs(), self.topic, lines, key_field=self.key_field))
        print(f"published {len(metas)} records to {self.topic}", file=sys.stderr)


def _check_json_objects(lines: list[bytes], source: str) -> None:
    """Every line is a JSON object, or a :class:`UsageError` naming the first that is not (nothing is published)."""
    import orjson

    from spinf_stream.errors import UsageError

    for n, line in enumerate(lines, 1):
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise UsageError(f"--input {source}: non-blank line {n} is not JSON ({e}); nothing was published "
                             "(--no-validate-json publishes lines as they are)") from None
        if not isinstance(value, dict):
            raise UsageError(f"--input {source}: non-blank line {n} is JSON but not an object; nothing was published "
                             "(--no-validate-json publishes lines as they are)")


class ConsumeCommand(ConsumeSettings):
    """Print a topic's records (from the beginning) to stdout as JSON lines."""

    def cli_cmd(self) -> None:
        from spinf_stream.stream.app import configure_logging
        from spinf_stream.stream.consume import format_record, read_topics
        from spinf_stream.stream.topic_checks import check_topic, run_check

        configure_logging(self.log_level)
        run_check(check_topic(self, self.topic))

        async def main() -> int:
            n = 0
            async for rec in read_topics(
                self.client_kwargs(), [self.topic], max_records=self.max, idle_timeout_s=self.timeout_s
            ):
                sys.stdout.buffer.write(format_record(rec, with_metadata=self.with_metadata) + b"\n")
                sys.stdout.flush()
                n += 1
            return n

        try:
            n = asyncio.run(main())
        except KeyboardInterrupt:
            return
        print(f"read {n} records from {self.topic}", file=sys.stderr)
