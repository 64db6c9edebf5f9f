"""End-to-end throughput and latency of the scorer service through a broker vs the offline engine,
in one run, honest by construction.

    python bench/stream_throughput.py --model smollm2-135m --pack spam --n 400
    python bench/stream_throughput.py --n 200                      # the default model
    python bench/stream_throughput.py --model /path/to/hf-dir --device cuda --n 5000

Same engine object, same messages, same pack and token budget, and the same thread for every
engine call (the service's :class:`~spinf_stream.stream.engine_thread.EngineThread`: loading,
warm-up, offline and stream passes; one OpenMP team, sized by the service's own rule):

1. offline: ``spinf_stream.cli.offline.score_file`` (what ``spinf-stream score`` runs) on the messages
   as a JSON-lines file, timed before and again after the stream runs, both reported;
2. stream at full backlog: the messages are published to an embedded Tansu broker first (not
   timed), then the service consumes, batches, scores, writes and commits; timed from its first
   consumed record to the broker's acknowledgement of its last written record (group join and
   model load excluded, as the offline time excludes model load);
3. stream at a paced rate (``--paced-rate``, default 80 % of the offline throughput): the service
   runs first, then the messages are published one by one on a fixed schedule; per record it
   reports the end-to-end latency (record timestamp → acknowledgement of its score), split into the
   broker's delivery (timestamp → read) and the service's part (read → acknowledgement), p50 and
   p99, against the latency window plus two forward passes.

Honesty: the load averages at start and end, torch's compute threads, and the CPU time other
processes took during each phase (from ``/proc/stat``, less this process and its broker) are
printed; before anything runs, the machine's CPU use is sampled for 2 s and the run is refused
when other processes use more than ``--max-busy`` CPUs (``--allow-loaded`` runs anyway, with a
warning on every result). The benchmark waits on events, never polls, so its own thread does not
take CPU from the engine. For each phase the engine's busy time (sum of ``Engine.run``) is printed,
which tells an engine slowed down (its tokens/s) from an engine left waiting (busy share).

``--telemetry off|on|both`` (default ``off``): ``on`` runs the service with its telemetry as in
production — the Prometheus reader and the ``/metrics``/``/healthz`` endpoint on a free loopback
port, scraped every second (harsher than Prometheus' 15 s), the lag sampler and status line —
plus, with ``--traces``, a tracer whose spans are exported to a sink that drops them. ``both``
alternates off and on ``--repeats`` times each and prints the cost of telemetry
(1 - on / off, in messages/s; goal < 2 %).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spinf_stream.config import DEFAULT_MODEL, RunSettings  # noqa: E402
from spinf_stream.device import usable_cpus  # noqa: E402
from spinf_stream.engine import Engine, Message  # noqa: E402
from spinf_stream.cli.offline import score_file  # noqa: E402
from spinf_stream.stream.app import prepare_engine_thread  # noqa: E402
from spinf_stream.stream.broker import EmbeddedBroker  # noqa: E402
from spinf_stream.stream.consume import read_topics  # noqa: E402
from spinf_stream.stream.engine_thread import EngineThread  # noqa: E402
from spinf_stream.stream.produce import produce_values  # noqa: E402
from spinf_stream.stream.service import ScoringService  # noqa: E402
from spinf_stream.stream.topics import ensure_topics  # noqa: E402
from spinf_stream.telemetry import StreamTelemetry, create_telemetry  # noqa: E402
from spinf_stream.telemetry.server import OpsServer  # noqa: E402

TARGET_RATIO = 0.95
EXIT_LOADED = 3


def load_messages(dataset: str, n: int) -> list[dict]:
    path = REPO.parent / "shared" / "data" / dataset / "dev.jsonl"
    with open(path, "rb") as f:
        rows = [orjson.loads(line) for _, line in zip(range(n), f)]
    if len(rows) < n:
        raise SystemExit(f"{path} has only {len(rows)} rows")
    return rows


# -- what else the machine is doing ----------------------------------------------------------------


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine spent busy since boot (``/proc/stat``), or None off Linux."""
    try:
        fields = open("/proc/stat").readline().split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _process_cpu_s(pid: int | None) -> float:
    """CPU seconds of another process (the broker), 0 when unknown."""
    if pid is None:
        return 0.0
    try:
        stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Usage:
    """Wall time of a phase and the CPU time spent in it by this process, the broker, and every
    other process of the machine."""

    wall_s: float = 0.0
    own_cpu_s: float = 0.0
    broker_cpu_s: float = 0.0
    others_cpu_s: float | None = None

    @property
    def others_cpus(self) -> float | None:
        """Other processes' mean CPU use during the phase, in CPUs."""
        if self.others_cpu_s is None or self.wall_s <= 0:
            return None
        return max(0.0, self.others_cpu_s) / self.wall_s


@contextmanager
def measured(broker_pid: Callable[[], int | None] = lambda: None) -> Iterator[Usage]:
    """Measure the ``with`` block: wall time and who used the CPUs."""
    u = Usage()
    m0, o0, b0, t0 = _machine_busy_s(), _own_cpu_s(), _process_cpu_s(broker_pid()), time.perf_counter()
    try:
        yield u
    finally:
        u.wall_s = time.perf_counter() - t0
        u.own_cpu_s = _own_cpu_s() - o0
        u.broker_cpu_s = _process_cpu_s(broker_pid()) - b0
        m1 = _machine_busy_s()
        if m0 is not None and m1 is not None:
            u.others_cpu_s = (m1 - m0) - u.own_cpu_s - u.broker_cpu_s


def sample_busy(seconds: float = 2.0) -> float | None:
    """Mean CPUs used by other processes over ``seconds`` (this process sleeps meanwhile)."""
    with measured() as u:
        time.sleep(seconds)
    return u.others_cpus


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


# -- the engine, timed -----------------------------------------------------------------------------


class PassClock:
    """Wraps ``engine.run`` (the call that computes, used by ``score_file`` through ``run_iter``
    and by the service) to add up its wall time, calls, passes and tokens."""

    def __init__(self, engine: Engine) -> None:
        self.seconds = 0.0
        self.durations: list[float] = []
        self.passes = 0
        self.tokens = 0
        run = engine.run

        def timed_run(prepared: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return run(prepared)
            finally:
                dt = time.perf_counter() - t0
                self.seconds += dt
                self.durations.append(dt)
                self.passes += engine.last_run.passes
                self.tokens += engine.last_run.tokens_computed

        engine.run = timed_run  # type: ignore[method-assign]

    def reset(self) -> None:
        self.seconds, self.durations, self.passes, self.tokens = 0.0, [], 0, 0


@dataclass
class Phase:
    name: str
    messages: int
    usage: Usage
    engine_s: float
    passes: int
    tokens: int
    detail: str = ""

    @property
    def rate(self) -> float:
        return self.messages / self.usage.wall_s

    def line(self) -> str:
        u = self.usage
        busy = 100 * self.engine_s / u.wall_s if u.wall_s else 0.0
        tok_s = self.tokens / self.engine_s if self.engine_s else 0.0
        others = "?" if u.others_cpus is None else f"{u.others_cpus:.2f}"
        return (f"{self.name:<26}{u.wall_s:>9.2f}{self.rate:>8.2f}{busy:>8.1f}%{tok_s:>9.0f}{self.passes:>7}"
                f"{others:>9}   {self.detail}")


HEADER = f"{'phase':<26}{'seconds':>9}{'msg/s':>8}{'engine':>9}{'tok/s':>9}{'passes':>7}{'others':>9}"


def time_offline(engine: Engine, clock: PassClock, messages: list[dict], name: str) -> tuple[Phase, dict[str, str]]:
    """Offline ``score_file`` on the engine thread (call this *on* it)."""
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "in.jsonl", Path(d) / "out.jsonl"
        src.write_bytes(b"".join(orjson.dumps(m) + b"\n" for m in messages))
        clock.reset()
        with measured() as usage:
            score_file(engine, str(src), str(dst), progress=False)
        records = [orjson.loads(line) for line in dst.read_bytes().splitlines()]
    phase = Phase(name, len(messages), usage, clock.seconds, clock.passes, clock.tokens)
    return phase, {r["id"]: r["digest"] for r in records if "digest" in r}


# -- the stream ------------------------------------------------------------------------------------


class _DropSpans:
    """A span exporter that drops what it gets (tracing cost without a collector's)."""

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class Latencies(StreamTelemetry):
    """Telemetry off, plus each acknowledged record's end-to-end latency (record timestamp → ack,
    wall clock) and the service's part of it (read → ack), in seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.end_to_end: list[float] = []
        self.service: list[float] = []

    def acked(self, topic: str, partition: int, timestamp_ms: int | None, read_at: float, *args: Any, **kwargs: Any) -> None:
        if timestamp_ms is not None and timestamp_ms >= 0:
            self.end_to_end.append(time.time() - timestamp_ms / 1000)
        self.service.append(time.monotonic() - read_at)
        super().acked(topic, partition, timestamp_ms, read_at, *args, **kwargs)


@contextmanager
def telemetry_for(settings: RunSettings, on: bool, traces: bool) -> Iterator[StreamTelemetry | None]:
    """``None`` (off), or telemetry with its endpoint on a free port, scraped every second."""
    if not on:
        yield None
        return
    telemetry = create_telemetry(settings, prometheus=True, span_exporter=_DropSpans() if traces else None, environ={})
    server = OpsServer("127.0.0.1", 0, telemetry.health, telemetry.providers.registry).start()
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(1.0):
            for path in ("/metrics", "/healthz"):
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as r:
                    r.read()

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        yield telemetry
    finally:
        stop.set()
        scraper.join()
        server.stop()
        telemetry.providers.shutdown()


def stream_settings(bootstrap: str, args: argparse.Namespace, group: str, telemetry_on: bool) -> RunSettings:
    return RunSettings.model_validate({
        "bootstrap_servers": bootstrap, "input_topic": ["in"], "output_topic": "out",
        "dlq_topic": "dlq", "group_id": group, "token_budget": args.token_budget,
        "window_ms": args.window_ms, "max_batch_messages": args.max_batch_messages,
        "max_inflight": args.max_inflight, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
        "metrics_port": 0, "status_interval_s": 30 if telemetry_on else 0,
    })


async def _read_digests(kafka: dict[str, Any], n: int) -> dict[str, str]:
    digests = {}
    async for rec in read_topics(kafka, ["out"], max_records=n):
        body = orjson.loads(rec.value)
        digests[body["id"]] = body["digest"]
    return digests


async def _until_acked(service: ScoringService, task: asyncio.Task[None], n: int) -> None:
    waiter = asyncio.create_task(service.wait_acked(n))
    await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    if not waiter.done():
        waiter.cancel()
        task.result()
        raise SystemExit("the service stopped early")
    waiter.result()


async def time_stream(
    engine: Engine, engine_thread: EngineThread, clock: PassClock, messages: list[dict], args: argparse.Namespace,
    telemetry_on: bool, name: str,
) -> tuple[Phase, dict[str, str]]:
    """Full backlog: publish everything, then run the service until the last record is acknowledged."""
    with EmbeddedBroker(port=0) as broker:
        kafka = {"bootstrap_servers": broker.bootstrap_servers}
        await ensure_topics(kafka, ["in", "out", "dlq"], partitions=args.partitions)
        await produce_values(kafka, "in", [orjson.dumps(m) for m in messages], keys=[m["id"].encode() for m in messages])
        settings = stream_settings(broker.bootstrap_servers, args, "bench", telemetry_on)
        with telemetry_for(settings, telemetry_on, args.traces) as telemetry:
            service = ScoringService(settings, engine, telemetry=telemetry, engine_thread=engine_thread)
            clock.reset()
            task = asyncio.create_task(service.run())
            await service.assigned.wait()
            # wall time: from the first consumed record (stats), as the offline time starts at its first line
            with measured(lambda: broker.pid) as usage:
                await _until_acked(service, task, len(messages))
            s = service.stats
            assert s.first_consumed_at is not None and s.last_acked_at is not None
            usage.wall_s = s.last_acked_at - s.first_consumed_at
            service.stop()
            await task
        digests = await _read_digests(kafka, len(messages))
    detail = (f"{s.batches} batches, {s.batch_messages / max(s.batches, 1):.0f} msg and "
              f"{s.batch_tokens / max(s.batches, 1):.0f} tokens each (fill {s.batch_tokens / max(s.batches, 1) / args.token_budget:.2f})")
    return Phase(name, len(messages), usage, clock.seconds, clock.passes, clock.tokens, detail), digests


@dataclass
class Paced:
    rate: float
    phase: Phase
    latencies: Latencies
    pass_s: list[float] = field(default_factory=list)


async def time_paced(
    engine: Engine, engine_thread: EngineThread, clock: PassClock, messages: list[dict], args: argparse.Namespace,
    rate: float,
) -> Paced:
    """The service runs first; then one message every ``1 / rate`` s, on a fixed schedule."""
    from aiokafka import AIOKafkaProducer

    with EmbeddedBroker(port=0) as broker:
        kafka = {"bootstrap_servers": broker.bootstrap_servers}
        await ensure_topics(kafka, ["in", "out", "dlq"], partitions=args.partitions)
        settings = stream_settings(broker.bootstrap_servers, args, "bench-paced", False)
        latencies = Latencies()
        service = ScoringService(settings, engine, telemetry=latencies, engine_thread=engine_thread)
        task = asyncio.create_task(service.run())
        await service.assigned.wait()
        producer = AIOKafkaProducer(**kafka, acks="all", linger_ms=0)
        await producer.start()
        clock.reset()
        try:
            with measured(lambda: broker.pid) as usage:
                start = time.monotonic()
                for i, m in enumerate(messages):
                    delay = start + i / rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await producer.send("in", orjson.dumps(m), key=m["id"].encode())  # timestamp: now
                await producer.flush()
                await _until_acked(service, task, len(messages))
        finally:
            await producer.stop()
        service.stop()
        await task
    phase = Phase(f"stream paced {rate:.2f} msg/s", len(messages), usage, clock.seconds, clock.passes, clock.tokens)
    return Paced(rate, phase, latencies, list(clock.durations))


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) with linear interpolation (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# -- main ------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_MODEL, help=f"model short name or path (default: the service's, {DEFAULT_MODEL})")
    ap.add_argument("--pack", default="spam")
    ap.add_argument("--dataset", default="sms_spam", help="folder of ../shared/data")
    ap.add_argument("--n", type=int, default=400, help="messages")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--window-ms", type=int, default=50)
    ap.add_argument("--max-batch-messages", type=int, default=512)
    ap.add_argument("--max-inflight", type=int, default=2048)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--paced-rate", type=float, default=0.8,
                    help="paced run's input rate as a share of the offline throughput (0: no paced run)")
    ap.add_argument("--paced-n", type=int, default=0, help="messages of the paced run (default: --n)")
    ap.add_argument("--max-busy", type=float, default=0.1,
                    help="refuse to run when other processes use more CPUs than this (sampled for 2 s at start)")
    ap.add_argument("--allow-loaded", action="store_true", help="run on a loaded machine anyway (results flagged)")
    ap.add_argument("--telemetry", choices=("off", "on", "both"), default="off",
                    help="stream runs with telemetry off, on, or both side by side (the cost of telemetry)")
    ap.add_argument("--traces", action="store_true", help="with telemetry on: also create spans (dropped)")
    ap.add_argument("--repeats", type=int, default=2, help="with --telemetry both: off/on pairs, alternating")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    cpus = usable_cpus()
    load_start = loadavg()
    busy = sample_busy()
    print(f"load average at start {load_start} (1, 5, 15 min)   usable CPUs {cpus}   "
          f"other processes' CPU use over 2 s: {'unknown' if busy is None else f'{busy:.2f} CPUs'}")
    loaded = busy is not None and busy > args.max_busy
    if loaded and not args.allow_loaded:
        print(f"REFUSED: other processes use {busy:.2f} CPUs (> --max-busy {args.max_busy}); the ratios would "
              "measure them, not the service. Run on an idle machine, or pass --allow-loaded to run anyway "
              "(the results are then flagged).", file=sys.stderr)
        raise SystemExit(EXIT_LOADED)
    warn = "   [LOADED MACHINE: NOT A VALID MEASUREMENT]" if loaded else ""
    if loaded:
        print(f"WARNING: the machine is loaded ({busy:.2f} CPUs used by other processes); every figure below "
              "is flagged and means little", file=sys.stderr)

    messages = load_messages(args.dataset, args.n)
    engine_thread = EngineThread()
    threads = engine_thread.call(prepare_engine_thread)
    engine = engine_thread.call(
        Engine.load, model=args.model, pack=args.pack, token_budget=args.token_budget, device=args.device, threads=threads,
    )
    engine_thread.call(engine.score, [Message(id=m["id"], fields=m) for m in messages[:16]])  # warm-up
    clock = PassClock(engine)
    omp = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}
    print(f"model {engine.model_name}  pack {engine.pack.name}@{engine.pack.version}  device {args.device}  "
          f"messages {len(messages)} ({args.dataset})  token budget {args.token_budget}  window {args.window_ms} ms")
    print(f"threads: engine 1 (loads and runs every pass, offline and stream) with {threads} compute workers of one torch thread each; "
          f"tokenization 1; event loop 1   {omp or '(no OMP_* overrides)'}")

    phases: list[Phase] = []
    off1, offline_digests = engine_thread.call(time_offline, engine, clock, messages, "offline before")
    phases.append(off1)
    modes = {"off": [False], "on": [True], "both": [False, True] * args.repeats}[args.telemetry]
    streams: dict[bool, list[Phase]] = {False: [], True: []}
    stream_digests: dict[str, str] = {}
    for k, on in enumerate(modes):
        name = f"stream backlog{' telemetry' if on else ''}" + (f" #{k + 1}" if len(modes) > 1 else "")
        phase, stream_digests = asyncio.run(time_stream(engine, engine_thread, clock, messages, args, on, name))
        streams[on].append(phase)
        phases.append(phase)
    paced = None
    if args.paced_rate > 0:
        rate = args.paced_rate * off1.rate
        paced_messages = messages[: args.paced_n] if args.paced_n else messages
        paced = asyncio.run(time_paced(engine, engine_thread, clock, paced_messages, args, rate))
        phases.append(paced.phase)
    off2, _ = engine_thread.call(time_offline, engine, clock, messages, "offline after")
    phases.append(off2)
    load_end = loadavg()

    print(f"\n{HEADER}   (engine: share of the time in Engine.run; tok/s: tokens computed per engine second; "
          "others: CPUs used by other processes)")
    for ph in phases:
        print(ph.line())
    offline_s = (off1.usage.wall_s + off2.usage.wall_s) / 2
    runs = streams[False] + streams[True]
    stream_s = sum(p.usage.wall_s for p in runs) / len(runs)
    ratio = offline_s / stream_s
    same = sum(stream_digests.get(k) == v for k, v in offline_digests.items())
    print(f"\nratio stream / offline: {ratio:.3f}   (stream {len(messages) / stream_s:.2f} msg/s against the mean of "
          f"offline before and after, {len(messages) / offline_s:.2f} msg/s; target >= {TARGET_RATIO}){warn}")
    print(f"digests equal to offline: {same}/{len(offline_digests)}")
    if paced is not None:
        lat = paced.latencies
        window_s = args.window_ms / 1000
        longest = max(paced.pass_s, default=0.0)
        bound = window_s + 2 * longest
        p99 = pct(lat.end_to_end, 0.99)
        delivery = [e - s for e, s in zip(lat.end_to_end, lat.service)] if len(lat.end_to_end) == len(lat.service) else []
        print(f"paced at {paced.rate:.2f} msg/s ({args.paced_rate:.0%} of offline before), {len(lat.end_to_end)} records, "
              f"{paced.phase.passes} passes (median {statistics.median(paced.pass_s) if paced.pass_s else 0:.3f} s, "
              f"longest {longest:.3f} s):")
        print(f"  end-to-end latency (record timestamp -> ack)  p50 {pct(lat.end_to_end, 0.5):.3f} s  p99 {p99:.3f} s")
        print(f"  of which the service (read -> ack)           p50 {pct(lat.service, 0.5):.3f} s  "
              f"p99 {pct(lat.service, 0.99):.3f} s")
        if delivery:
            print(f"  of which the broker's delivery (-> read)     p50 {pct(delivery, 0.5):.3f} s  p99 {pct(delivery, 0.99):.3f} s")
        print(f"  p99 {p99:.3f} s against the window + two forward passes ({window_s:.3f} + 2 x {longest:.3f} = "
              f"{bound:.3f} s): {'below' if p99 < bound else 'NOT below'}{warn}")
    if streams[False] and streams[True]:
        off_rate = len(messages) / (sum(p.usage.wall_s for p in streams[False]) / len(streams[False]))
        on_rate = len(messages) / (sum(p.usage.wall_s for p in streams[True]) / len(streams[True]))
        print(f"telemetry off: {off_rate:.1f} msg/s  {['%.2f s' % p.usage.wall_s for p in streams[False]]}")
        print(f"telemetry on{' + traces' if args.traces else ''}:  {on_rate:.1f} msg/s  "
              f"{['%.2f s' % p.usage.wall_s for p in streams[True]]}")
        print(f"cost of telemetry: {100 * (1 - on_rate / off_rate):+.2f} % of throughput   (goal < 2 %){warn}")
    worst = max((p.usage.others_cpus or 0.0) for p in phases)
    print(f"load average at end {load_end} (includes this benchmark's own {threads} compute threads)   "
          f"other processes used up to {worst:.2f} CPUs during a phase")
    if worst > args.max_busy:
        print(f"WARNING: other processes used {worst:.2f} CPUs during a phase (> {args.max_busy}): "
              "the figures above are not a measurement of the service alone", file=sys.stderr)
    engine_thread.close()


if __name__ == "__main__":
    main()
