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

from spinf_stream.engine import DEFAULT_TOKEN_BUDGET

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
DEFAULT_PACK = "spam"

#: ``--device``/``--dtype`` (checked against the machine by ``spinf_stream.device.choose``)
DEVICE_PATTERN = r"^(auto|cpu|cuda|cuda:[0-9]+)$"
DType = Literal["auto", "float32", "bfloat16", "fp8", "int8"]
DEVICE_HELP = "Where the model runs: auto (CUDA when torch sees a GPU, else the CPU), cpu, cuda or cuda:N."
DTYPE_HELP = (
    "Weights and activations: auto (bfloat16 on CUDA, float32 on the CPU), float32, bfloat16, "
    "fp8 (GPUs with compute capability 8.9 or newer) or int8 (linear weights in int8, the rest bfloat16: "
    "GPUs with compute capability 8.0 or newer, and the CPU)."
)
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LOG_LEVEL_HELP = "Log level (message content is never logged); DEBUG also shows tracebacks."


def plain(metavar: str | None = None, allowed: str | None = None) -> dict[str, str]:
    """``json_schema_extra`` of a field whose ``--help`` needs plainer words than its type gives:
    ``metavar`` (the value's placeholder, e.g. ``HOST:PORT``) and ``allowed`` (what it may be)."""
    out = {}
    if metavar:
        out["metavar"] = metavar
    if allowed:
        out["allowed"] = allowed
    return out


# The fields every model-loading command shares (score, evaluate, calibrate, run, dev): one
# definition, so their --help and checks cannot drift apart.


def pack_field(default: Any = ...) -> Any:
    """``--pack`` (required unless a default is given)."""
    return Field(default, description="Prompt pack: a pack file (packs/spam.yaml) or the name of a shipped pack (spam).",
                 json_schema_extra=plain("NAME|FILE"))


def model_field() -> Any:
    """``--model``, defaulting to :data:`DEFAULT_MODEL`."""
    return Field(
        DEFAULT_MODEL,
        description="Decision model: qwen2.5-coder-0.5b, gemma-3-270m, smollm2-135m (from PyPI), or a path to a HF directory or a .gguf file.",
        json_schema_extra=plain("NAME|PATH"),
    )


def device_field() -> Any:
    """``--device``: auto, cpu, cuda or cuda:N."""
    return Field("auto", pattern=DEVICE_PATTERN, description=DEVICE_HELP,
                 json_schema_extra=plain("{auto,cpu,cuda,cuda:N}", "auto, cpu, cuda or cuda:N"))


def dtype_field() -> Any:
    """``--dtype``: auto, float32, bfloat16 or fp8."""
    return Field("auto", description=DTYPE_HELP)


def calibration_field() -> Any:
    """``--calibration FILE|NAME|auto|none``, defaulting to auto."""
    return Field("auto", description="Calibration: a calibration file, auto (the pack's shipped calibration for this model, if any), "
                 "the name of one the pack ships beside it (e.g. recall95: `spinf-stream packs list`) or none.",
                 json_schema_extra=plain("FILE|NAME|auto|none"))


def allow_unstable_bits_field() -> Any:
    """``--allow-unstable-bits``: score even when the bits probe fails."""
    return Field(
        False,
        description="Score even when the check at load finds that this machine's BLAS would make a message's bits "
        "depend on its batch (records then say bits_probe: failed); default: refuse with exit code 2.",
    )


def token_budget_field(description: str = "Tokens per forward pass (scores do not depend on it).") -> Any:
    """``--token-budget``: at least 64 tokens."""
    return Field(DEFAULT_TOKEN_BUDGET, ge=64, description=description)


def _settings_config(**extra: Any) -> SettingsConfigDict:
    return SettingsConfigDict(
        env_prefix="SPINF_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="ignore",
        **extra,
    )


#: the settings config of every command (``SPINF_`` variables, kebab-case flags); for commands
#: defined in other modules (``spinf-stream score``)
settings_config = _settings_config


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
        json_schema_extra=plain("HOST:PORT[,HOST:PORT...]", "host:port pairs, comma-separated"),
    )
    client_id: str = Field("spinf-stream", description="Client id sent to the brokers (shows in broker logs and metrics).")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security protocol."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="SASL mechanism (with --security-protocol SASL_PLAINTEXT or SASL_SSL)."
    )
    sasl_username: str | None = Field(None, description="SASL username.")
    sasl_password: SecretStr | None = Field(
        None, description="SASL password (prefer the SPINF_SASL_PASSWORD variable).", json_schema_extra=plain("PASSWORD")
    )
    ssl_cafile: Path | None = Field(None, description="CA certificate file (PEM) to verify the brokers (SSL, SASL_SSL).")
    ssl_certfile: Path | None = Field(None, description="Client certificate file (PEM) for mutual TLS.")
    ssl_keyfile: Path | None = Field(None, description="Client private key file (PEM) for mutual TLS.")

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        if self.security_protocol.startswith("SASL_"):
            if self.sasl_mechanism is None:
                raise ValueError(
                    f"--security-protocol {self.security_protocol} needs --sasl-mechanism "
                    "(SPINF_SASL_MECHANISM): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
                )
            missing = [
                f"--{name.replace('_', '-')} (SPINF_{name.upper()})"
                for name in ("sasl_username", "sasl_password")
                if getattr(self, name) is None
            ]
            if missing:
                raise ValueError(f"--security-protocol {self.security_protocol} needs {' and '.join(missing)}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                "--ssl-certfile (SPINF_SSL_CERTFILE) and --ssl-keyfile (SPINF_SSL_KEYFILE) go together: give both or neither"
            )
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


class ApiSettings(BaseSettings):
    """The HTTP API's settings (``serve``; README, "Scoring over HTTP")."""

    api_host: str | None = Field(
        None, description="Address the HTTP API listens on. Default: 0.0.0.0 with an API key, 127.0.0.1 (loopback only) without one.")
    api_port: int = Field(8000, ge=0, le=65535, description="Port of the HTTP API (0: no API).")
    api_key: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="API keys (comma-separated; also SPINF_API_KEYS): requests need Authorization: Bearer <key>. "
        "None: no key asked, and the API listens on loopback unless --api-host is given.")
    api_window_ms: float = Field(5.0, ge=0, description="Latency window (ms) of API requests: how long a request waits for others to share its pass.")
    api_max_body_bytes: int = Field(8 << 20, ge=1024, description="Largest request body (bytes); a larger one gets 413.")
    api_max_messages: int = Field(1024, ge=1, description="Messages per request, at most (400 above).")
    api_timeout_s: float = Field(60.0, gt=0, description="A request not answered in this many seconds gets 504 (its messages not yet scored are dropped).")
    api_max_queue: int = Field(4096, ge=1, description="Messages queued for the engine, at most; a request that would pass it gets 429 with Retry-After.")
    api_inline_packs: bool = Field(True, description="Accept a pack given inline in a /v1/score request (its YAML as a JSON object), for authoring.")
    api_max_logprobs: int = Field(20, ge=0, description="The most alternatives (top-N) /v1/completions gives per token (its logprobs).")

    @field_validator("api_key", mode="before")
    @classmethod
    def _keys(cls, value: Any) -> Any:
        return _topics(value)

    @model_validator(mode="after")
    def _keys_env(self) -> ApiSettings:
        import os

        if not self.api_key and os.environ.get("SPINF_API_KEYS"):
            self.api_key = [SecretStr(k) for k in _topics(os.environ["SPINF_API_KEYS"])]
        return self

    def listen_host(self) -> str:
        """The address to bind: ``--api-host``, else all interfaces with a key, loopback without."""
        if self.api_host is not None:
            return self.api_host
        return "0.0.0.0" if self.api_key else "127.0.0.1"


class ScoringSettings(ApiSettings):
    """What the scorer reads, how it batches, and where it writes (shared by ``run`` and ``dev``)."""

    model_config = _settings_config()

    input_topic: Annotated[list[str], NoDecode] = Field(
        ["messages"],
        description="Topic to score (repeat the flag, or comma-separate, for several).",
        json_schema_extra=plain("TOPIC[,TOPIC...]", "topic names"),
    )
    output_topic: str = Field("scores", description="Topic the score records are written to.")
    dlq_topic: str = Field("scores.dlq", description="Dead-letter topic: one record per message that could not be scored.")
    group_id: str = Field("spinf-stream", description="Consumer group id; replicas with the same id split the partitions.")
    pack: str = pack_field(DEFAULT_PACK)
    model: str = model_field()
    device: str = device_field()
    dtype: DType = dtype_field()
    calibration: str = calibration_field()
    allow_unstable_bits: bool = allow_unstable_bits_field()
    routes: Path | None = Field(
        None,
        description="Routes file (YAML): which packs, with which models, score which topics, and where their records go "
        "(README, \"Many packs and models\"). Replaces --input-topic, --output-topic, --dlq-topic, --pack, --model, "
        "--calibration and --token-budget.",
        json_schema_extra=plain("FILE"),
    )
    model_memory_budget: float | None = Field(
        None, gt=0,
        description="GiB of model weights and KV working set the loaded models may take together; loading one more "
        "evicts the least recently used idle model (default: nine tenths of the GPU's memory, or of the usable RAM on the CPU).",
    )
    model_idle_evict_s: float | None = Field(
        None, gt=0, description="Unload a model no batch has used for this long (s; default: never)."
    )
    model_swap_wait_ms: int = Field(
        2000, ge=0,
        description="A pack whose model is not loaded waits this long (ms) before its batch may displace the loaded "
        "models' batches (then its model is loaded, evicting another if the memory budget says so).",
    )
    fairness_cap: int = Field(
        4, ge=1, description="Batches one (pack, model) may run in a row while another has a batch ready."
    )
    window_ms: int = Field(50, ge=0, description="Latency window (ms): a batch closes this long after its first message if the engine is free.")
    token_budget: int = token_budget_field("Tokens per forward pass; a batch closes when its messages reach it.")
    max_batch_messages: int = Field(512, ge=1, description="A batch closes when it holds this many messages.")
    max_inflight: int = Field(
        2048,
        ge=1,
        description="Messages consumed but not yet written and acknowledged, at most; a partition pauses when its own reach max_inflight / assigned partitions (backpressure), every one at the total.",
    )
    input_format: Literal["json", "text", "image"] = Field(
        "json",
        description="json: each value is a JSON object with the pack's fields (and an optional id); text: each value is raw UTF-8 text, the value of the pack's one field; image: each value is a picture (PNG, JPEG, WebP) in the pack's first field, its other fields and id a JSON object in the spinf-fields header.",
    )
    special_tokens_in_fields: Literal["plain", "parse"] | None = Field(
        None,
        description="Special-token text in message fields: plain text, or parse it into control tokens (the tokenizer's default); default: the pack's special_tokens_in_fields (plain unless it says so).",
    )
    too_long: Literal["truncate", "reject"] = Field(
        "reject",
        description="Over-long text: reject (dead-letter record, kind too_long) or truncate (score the longest prefix that fits; the record says so).",
    )
    max_message_bytes: int = Field(
        4 * 1024 * 1024, ge=1,
        description="Largest input value read (bytes); a longer one is dead-lettered as too_long without being read.",
    )
    max_prepare_s: float = Field(
        30.0, gt=0,
        description="Longest time one message may take to tokenize (with --too-long truncate: to find its prefix) before it is dead-lettered as too_slow (s).",
    )
    max_request_size: int = Field(
        1024 * 1024, ge=4096,
        description="Largest record the producer writes (bytes, Kafka's max.request.size); dead letters are cut to fit it and the topic's max.message.bytes.",
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
    log_level: LogLevel = Field("INFO", description=LOG_LEVEL_HELP)
    metrics_port: int = Field(
        9464, ge=0, le=65535,
        description="Port of the HTTP endpoint with /metrics (Prometheus), /healthz and /readyz (0 = off).",
    )
    metrics_host: str = Field("0.0.0.0", description="Address the metrics and health endpoint listens on.")
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text, or as JSON objects (time, level, logger, message, fields), one per line."
    )
    status_interval_s: float = Field(
        30.0, ge=0, description="Seconds between status lines at INFO (consumed, scored, dead-lettered, lag, questions/s); 0 = none."
    )
    lag_interval_s: float = Field(
        5.0, gt=0, description="Seconds between samples of consumer lag (messages and seconds), in-flight records and paused partitions."
    )
    liveness_timeout_s: float = Field(
        300.0, gt=0,
        description="/healthz fails when one engine batch runs, the event loop stalls, or records wait with none written, longer than this (s).",
    )
    liveness_rebalances: int = Field(
        5, ge=1,
        description="/healthz fails after this many rebalances in a row with no record written between them.",
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
            raise ValueError(
                f"--heartbeat-interval-ms {self.heartbeat_interval_ms} must be below --session-timeout-ms "
                f"{self.session_timeout_ms} (SPINF_HEARTBEAT_INTERVAL_MS, SPINF_SESSION_TIMEOUT_MS)"
            )
        return self


class RunSettings(ScoringSettings, KafkaSettings):
    """``spinf-stream run``: score a Kafka topic into a scores topic and a dead-letter topic."""

    model_config = _settings_config()

    allow_missing_topics: bool = Field(
        False,
        description="Start even when an input topic does not exist yet (a warning; the scorer picks it up once it is created). Without it a missing input topic is an error.",
    )


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
        json_schema_extra=plain("FILE"),
    )
    key_field: str | None = Field("id", description="With --input: the JSON field used as the record key (none: no key).")
    print: Literal["jsonl", "table", "none"] = Field(
        "jsonl",
        description="What stdout shows of the score and dead-letter records of the messages dev published (with "
        "--input; else every one read): jsonl (each record as it comes), table (one row per message in input order, "
        "then a summary, when dev stops) or none.",
    )
    records: Path | None = Field(
        None,
        description="Also write those records to this JSON Lines file (replaced), as they come.",
        json_schema_extra=plain("FILE"),
    )
    until_done: bool = Field(
        False,
        description="With --input: stop (drain, commit, stop the broker) once every published message has a record.",
    )


class ServeSettings(ApiSettings):
    """``spinf-stream serve``: the HTTP API alone, no Kafka (pack, model and device as for ``score``)."""

    model_config = _settings_config()

    pack: str = pack_field(DEFAULT_PACK)
    model: str = model_field()
    device: str = device_field()
    dtype: DType = dtype_field()
    calibration: str = calibration_field()
    allow_unstable_bits: bool = allow_unstable_bits_field()
    token_budget: int = token_budget_field("Tokens per forward pass; a batch closes when its messages reach it.")
    max_batch_messages: int = Field(512, ge=1, description="A batch closes when it holds this many messages.")
    special_tokens_in_fields: Literal["plain", "parse"] | None = Field(
        None, description="How text in fields that looks like the tokenizer's special tokens is read (default: the pack's).")
    too_long: Literal["truncate", "reject"] = Field(
        "reject", description="A message longer than the model's context: reject (an error record naming it) or truncate its longest field.")
    max_prepare_s: float = Field(10.0, gt=0, description="A message whose tokenization takes longer is a too_slow error record.")
    log_level: LogLevel = Field("INFO", description=LOG_LEVEL_HELP)
    log_format: Literal["text", "json"] = Field("text", description="text: human-readable lines; json: one JSON object per line.")


class ProduceSettings(KafkaSettings):
    """``spinf-stream produce``: publish a JSON-lines file to a topic, one record per line."""

    model_config = _settings_config()

    topic: str = Field(description="Topic to publish to.", json_schema_extra=plain("TOPIC"))
    input: str = Field(
        "-", description="JSON-lines file to publish ('-' = stdin); blank lines are skipped.", json_schema_extra=plain("FILE")
    )
    key_field: str | None = Field(None, description="JSON field whose value becomes the record key (e.g. id).")
    validate_json: bool = Field(
        True, description="With a .jsonl input file: check that every line is a JSON object before publishing any "
        "(stdin and other files may hold raw text on purpose and are not checked).",
    )
    log_level: LogLevel = Field("WARNING", description=LOG_LEVEL_HELP)


class ConsumeSettings(KafkaSettings):
    """``spinf-stream consume``: print a topic's records as JSON lines, from the beginning."""

    model_config = _settings_config()

    topic: str = Field(description="Topic to read.", json_schema_extra=plain("TOPIC"))
    max: int | None = Field(None, ge=1, description="Stop after this many records.")
    timeout_s: float | None = Field(
        None, gt=0, description="Stop when no record arrived for this long (s); default: follow forever (or until --max)."
    )
    with_metadata: bool = Field(
        False, description="Wrap each value with its topic, partition, offset, timestamp, key and headers."
    )
    log_level: LogLevel = Field("WARNING", description=LOG_LEVEL_HELP)
