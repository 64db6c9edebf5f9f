"""End-to-end throughput of the scorer service through a broker vs the offline engine, in one run.

    python bench/stream_throughput.py --model smollm2-135m --pack spam --n 1000
    python bench/stream_throughput.py --model /path/to/hf-dir --device cuda --n 5000

Same engine object, same messages, same pack and token budget for both:

- offline: ``spinf_stream.offline.score_file`` (what ``spinf-stream score`` runs) on the messages
  as a JSON-lines file, timed twice — before and after the stream run — and averaged, so drift of a
  shared machine cancels out;
- stream: the messages are published to an embedded Tansu broker first (not timed), then the
  service consumes, batches, scores, writes and commits; timed from its first consumed record to
  the broker's acknowledgement of its last written record (group join and model load excluded,
  as the offline time excludes model load).

Prints messages/s of each and the ratio stream / offline (target ≥ 0.9), and checks that every
stream record's digest equals the offline one.

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
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spinf_stream.config import RunSettings  # noqa: E402
from spinf_stream.engine import Engine, Message  # noqa: E402
from spinf_stream.offline import score_file  # noqa: E402
from spinf_stream.stream.broker import EmbeddedBroker  # noqa: E402
from spinf_stream.stream.consume import read_topics  # noqa: E402
from spinf_stream.stream.produce import produce_values  # noqa: E402
from spinf_stream.stream.service import ScoringService  # noqa: E402
from spinf_stream.stream.topics import ensure_topics  # noqa: E402
from spinf_stream.telemetry import StreamTelemetry, create_telemetry  # noqa: E402
from spinf_stream.telemetry.server import OpsServer  # noqa: E402


def load_messages(dataset: str, n: int) -> list[dict]:
    path = REPO.parent / "shared" / "data" / dataset / "dev.jsonl"
    with open(path, "rb") as f:
        rows = [orjson.loads(line) for _, line in zip(range(n), f)]
    if len(rows) < n:
        raise SystemExit(f"{path} has only {len(rows)} rows")
    return rows


def time_offline(engine: Engine, messages: list[dict]) -> tuple[float, dict[str, str]]:
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "in.jsonl", Path(d) / "out.jsonl"
        src.write_bytes(b"".join(orjson.dumps(m) + b"\n" for m in messages))
        t0 = time.perf_counter()
        score_file(engine, str(src), str(dst), progress=False)
        dt = time.perf_counter() - t0
        records = [orjson.loads(line) for line in dst.read_bytes().splitlines()]
    return dt, {r["id"]: r["digest"] for r in records if "digest" in r}


class _DropSpans:
    """A span exporter that drops what it gets (tracing cost without a collector's)."""

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@contextmanager
def telemetry_for(settings: RunSettings, on: bool, traces: bool):
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


async def time_stream(
    engine: Engine, messages: list[dict], args: argparse.Namespace, telemetry_on: bool = False
) -> tuple[float, ScoringService, dict[str, str]]:
    with EmbeddedBroker(port=0) as broker:
        kafka = {"bootstrap_servers": broker.bootstrap_servers}
        await ensure_topics(kafka, ["in", "out", "dlq"], partitions=args.partitions)
        await produce_values(kafka, "in", [orjson.dumps(m) for m in messages], keys=[m["id"].encode() for m in messages])
        settings = RunSettings.model_validate({
            "bootstrap_servers": broker.bootstrap_servers, "input_topic": ["in"], "output_topic": "out",
            "dlq_topic": "dlq", "group_id": "bench", "token_budget": args.token_budget,
            "window_ms": args.window_ms, "max_batch_messages": args.max_batch_messages,
            "max_inflight": args.max_inflight, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
            "metrics_port": 0, "status_interval_s": 30 if telemetry_on else 0,
        })
        with telemetry_for(settings, telemetry_on, args.traces) as telemetry:
            service = ScoringService(settings, engine, telemetry=telemetry)
            task = asyncio.create_task(service.run())
            while service.stats.acked < len(messages):
                if task.done():
                    task.result()
                    raise SystemExit("the service stopped early")
                await asyncio.sleep(0.01)
            s = service.stats
            elapsed = s.last_acked_at - s.first_consumed_at
            service.stop()
            await task
        digests = {}
        async for rec in read_topics(kafka, ["out"], max_records=len(messages)):
            body = orjson.loads(rec.value)
            digests[body["id"]] = body["digest"]
        return elapsed, service, digests


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="model short name or path")
    ap.add_argument("--pack", default="spam")
    ap.add_argument("--dataset", default="sms_spam", help="folder of ../shared/data")
    ap.add_argument("--n", type=int, default=1000, help="messages")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--window-ms", type=int, default=50)
    ap.add_argument("--max-batch-messages", type=int, default=512)
    ap.add_argument("--max-inflight", type=int, default=2048)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--telemetry", choices=("off", "on", "both"), default="off",
                    help="stream runs with telemetry off, on, or both side by side (the cost of telemetry)")
    ap.add_argument("--traces", action="store_true", help="with telemetry on: also create spans (dropped)")
    ap.add_argument("--repeats", type=int, default=2, help="with --telemetry both: off/on pairs, alternating")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    messages = load_messages(args.dataset, args.n)
    engine = Engine.load(model=args.model, pack=args.pack, token_budget=args.token_budget, device=args.device)
    engine.score([Message(id=m["id"], fields=m) for m in messages[:16]])  # warm-up

    off1, offline_digests = time_offline(engine, messages)
    modes = {"off": [False], "on": [True], "both": [False, True] * args.repeats}[args.telemetry]
    by_mode: dict[bool, list[float]] = {False: [], True: []}
    for on in modes:
        stream_s, service, stream_digests = asyncio.run(time_stream(engine, messages, args, telemetry_on=on))
        by_mode[on].append(stream_s)
    off2, _ = time_offline(engine, messages)
    offline_s = (off1 + off2) / 2
    runs = by_mode[False] + by_mode[True]
    stream_s = sum(runs) / len(runs)

    n = len(messages)
    st = service.stats
    same = sum(stream_digests.get(k) == v for k, v in offline_digests.items())
    print(f"model {engine.model_name}  pack {engine.pack.name}@{engine.pack.version}  device {args.device}  "
          f"messages {n} ({args.dataset})  token budget {args.token_budget}  window {args.window_ms} ms")
    print(f"{'path':<34}{'seconds':>10}{'msg/s':>10}")
    print(f"{'offline score (mean of 2)':<34}{offline_s:>10.2f}{n / offline_s:>10.1f}   ({off1:.2f} s, {off2:.2f} s)")
    print(f"{'stream via broker (mean of %d)' % len(runs):<34}{stream_s:>10.2f}{n / stream_s:>10.1f}   "
          f"({st.batches} batches, {st.batch_messages / max(st.batches, 1):.0f} msg/batch)")
    print(f"ratio stream / offline: {offline_s / stream_s:.3f}   (target >= 0.9)")
    print(f"digests equal to offline: {same}/{len(offline_digests)}")
    if by_mode[False] and by_mode[True]:
        off_rate = n / (sum(by_mode[False]) / len(by_mode[False]))
        on_rate = n / (sum(by_mode[True]) / len(by_mode[True]))
        print(f"telemetry off: {off_rate:.1f} msg/s  {['%.2f s' % x for x in by_mode[False]]}")
        print(f"telemetry on{' + traces' if args.traces else ''}:  {on_rate:.1f} msg/s  "
              f"{['%.2f s' % x for x in by_mode[True]]}")
        print(f"cost of telemetry: {100 * (1 - on_rate / off_rate):+.2f} % of throughput   (goal < 2 %)")


if __name__ == "__main__":
    main()
