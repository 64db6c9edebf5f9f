"""Settings of the stream commands: flags and ``SPINF_*`` environment variables (pydantic-settings).

Every field is a flag in kebab-case (``--bootstrap-servers``) and an environment variable in
upper snake case with the ``SPINF_`` prefix (``SPINF_BOOTSTRAP_SERVERS``); a flag wins over the
environment. Each field's description is its ``--help`` text.

The classes compose: :class:`KafkaSettings` (where the cluster is and how to authenticate),
:class:`ScoringSettings` (what to read, how to batch, where to write), and the settings of each
command built from them: :class:`RunSettings` (``spinf-stream run``), :class:`DevSettings`
(``spinf-stream dev``: the same scorer on an embedded broker), :class:`ProduceSettings` and
:class:`ConsumeSettings`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
DEFAULT_PACK = "spam"


def _settings_config(**extra: Any) -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix="SPINF_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="ignore",
        **extra,
    )


def _topics(value: Any) -> Any:
    """Accept a list, a JSON list, or a comma-separated string (handy in env files)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [t.strip() for t in text.split(",") if t.strip()]
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            out.extend(_topics(item) if isinstance(item, str) else [item])
        return out
    return value


class KafkaSettings(BaseSettings):
    """Where the Kafka cluster is and how to talk to it (passed to aiokafka clients)."""

    model_config = _settings_config()

    bootstrap_servers: str = Field(
        DEFAULT_BOOTSTRAP,
        description="Kafka bootstrap servers, comma-separated host:port list.",
    )
    client_id: str = Field("spinf-stream", description="Client id sent to the brokers (shows in broker logs and metrics).")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security protocol."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism (with --security-protocol SASL_PLAINTEXT or SASL_SSL)."
    )
    sasl_username: str | None = Field(None, description="SASL username.")
    sasl_password: SecretStr | None = Field(None, description="SASL password (prefer the SPINF_SASL_PASSWORD variable).")
    ssl_cafile: Path | None = Field(None, description="CA certificate file (PEM) to verify the brokers (SSL, SASL_SSL).")
    ssl_certfile: Path | None = Field(None, description="Client certificate file (PEM) for mutual TLS.")
    ssl_keyfile: Path | None = Field(None, description="Client private key file (PEM) for mutual TLS.")

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL_"):
            if self.sasl_mechanism is None:
                raise ValueError(f"--security-protocol {self.security_protocol} needs --sasl-mechanism")
            if self.sasl_username is None or self.sasl_password is None:
                raise ValueError("SASL needs --sasl-username and --sasl-password")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("--ssl-certfile and --ssl-keyfile go together")
        return self

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by aiokafka's consumer, producer and admin client."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
                certfile=str(self.ssl_certfile) if self.ssl_certfile else None,
                keyfile=str(self.ssl_keyfile) if self.ssl_keyfile else None,
            )
        if self.security_protocol.startswith("SASL_"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password.get_secret_value() if self.sasl_password else None
        return kwargs


class ScoringSettings(BaseSettings):
    """What the scorer reads, how it batches, and where it writes (shared by ``run`` and ``dev``)."""

    model_config = _settings_config()

    input_topic: Annotated[list[str], NoDecode] = Field(
        ["messages"],
        description="Topic to score (repeat the flag, or comma-separate, for several).",
    )
    output_topic: str = Field("scores", description="Topic the score records are written to.")
    dlq_topic: str = Field("scores.dlq", description="Dead-letter topic: one record per message that could not be scored.")
    group_id: str = Field("spinf-stream", description="Consumer group id; replicas with the same id split the partitions.")
    pack: str = Field(DEFAULT_PACK, description="Prompt pack: a name shipped in packs/ or a path to a pack YAML file.")
    model: str = Field(DEFAULT_MODEL, description="Decision model: a short name (installed from PyPI) or a path to a HF directory or GGUF file.")
    calibration: str = Field(
        "auto",
        description="Calibration: a calibration file, auto (the pack's shipped calibration for this model, if any) or none.",
    )
    window_ms: int = Field(50, ge=0, description="Latency window (ms): a batch closes this long after its first message if the engine is free.")
    token_budget: int = Field(16384, ge=64, description="Tokens per forward pass; a batch closes when its messages reach it.")
    max_batch_messages: int = Field(512, ge=1, description="A batch closes when it holds this many messages.")
    max_inflight: int = Field(
        2048,
        ge=1,
        description="Messages consumed but not yet written and acknowledged; above it the partitions are paused (backpressure).",
    )
    input_format: Literal["json", "text"] = Field(
        "json",
        description="json: each value is a JSON object with the pack's fields (and an optional id); text: each value is raw UTF-8 text, the pack's {text}.",
    )
    too_long: Literal["truncate", "reject"] = Field(
        "reject",
        description="Over-long text: reject (dead-letter record, kind too_long) or truncate (score the longest prefix that fits; the record says so).",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a consumer group with no committed offset starts."
    )
    session_timeout_ms: int = Field(45000, ge=1000, description="Consumer group session timeout (ms): a member silent this long is removed.")
    heartbeat_interval_ms: int = Field(3000, ge=100, description="Consumer group heartbeat interval (ms).")
    max_poll_interval_ms: int = Field(
        300000,
        ge=1000,
        description="Longest gap between polls before the member leaves the group (ms); the scorer keeps polling during long batches.",
    )
    commit_interval_ms: int = Field(1000, ge=0, description="How often acknowledged offsets are committed (ms).")
    enable_idempotence: bool = Field(
        False,
        description="Idempotent producer (needs broker support; off for the embedded Tansu broker).",
    )
    shutdown_timeout_s: float = Field(
        60.0, gt=0, description="On SIGTERM/SIGINT: how long to drain, write and commit before giving up (s)."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level (message content is never logged).")
    health_file: Path | None = Field(
        None,
        description="Touch this file every second while the consumer loop is alive (for container healthchecks).",
    )

    @field_validator("input_topic", mode="before")
    @classmethod
    def _split_topics(cls, v: Any) -> Any:
        return _topics(v)

    @field_validator("input_topic")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("at least one --input-topic")
        return v

    @model_validator(mode="after")
    def _check_timeouts(self) -> ScoringSettings:
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("--heartbeat-interval-ms must be below --session-timeout-ms")
        return self


class RunSettings(ScoringSettings, KafkaSettings):
    """``spinf-stream run``: score a Kafka topic into a scores topic and a dead-letter topic."""

    model_config = _settings_config()


class DevSettings(ScoringSettings):
    """``spinf-stream dev``: an embedded broker (Tansu, memory storage), its topics, and the scorer."""

    model_config = _settings_config()

    # One member on a local broker: short group timeouts make the first join quick
    # (Tansu holds a join for half the session timeout).
    session_timeout_ms: int = Field(6000, ge=1000, description="Consumer group session timeout (ms): a member silent this long is removed.")
    heartbeat_interval_ms: int = Field(1000, ge=100, description="Consumer group heartbeat interval (ms).")
    port: int = Field(9092, ge=0, le=65535, description="Loopback port of the embedded broker (0 = any free port).")
    partitions: int = Field(3, ge=1, description="Partitions of each topic the dev command creates.")
    input: Path | None = Field(
        None,
        description="JSON-lines file to publish to the (first) input topic once the scorer is up ('-' = stdin).",
    )
    key_field: str | None = Field("id", description="With --input: the JSON field used as the record key (none: no key).")
    print_records: bool = Field(True, description="Print score and dead-letter records to stdout as JSON lines.")
    until_done: bool = Field(
        False,
        description="With --input: stop (drain, commit, stop the broker) once every published message has a record.",
    )


class ProduceSettings(KafkaSettings):
    """``spinf-stream produce``: publish a JSON-lines file to a topic, one record per line."""

    model_config = _settings_config()

    topic: str = Field(description="Topic to publish to.")
    input: str = Field("-", description="JSON-lines file to publish ('-' = stdin); blank lines are skipped.")
    key_field: str | None = Field(None, description="JSON field whose value becomes the record key (e.g. id).")


class ConsumeSettings(KafkaSettings):
    """``spinf-stream consume``: print a topic's records as JSON lines, from the beginning."""

    model_config = _settings_config()

    topic: str = Field(description="Topic to read.")
    max: int | None = Field(None, ge=1, description="Stop after this many records.")
    timeout_s: float | None = Field(
        None, gt=0, description="Stop when no record arrived for this long (s); default: follow forever (or until --max)."
    )
    with_metadata: bool = Field(
        False, description="Wrap each value with its topic, partition, offset, timestamp, key and headers."
    )
