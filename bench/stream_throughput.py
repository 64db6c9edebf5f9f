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
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

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


async def time_stream(engine: Engine, messages: list[dict], args: argparse.Namespace) -> tuple[float, ScoringService, dict[str, str]]:
    with EmbeddedBroker(port=0) as broker:
        kafka = {"bootstrap_servers": broker.bootstrap_servers}
        await ensure_topics(kafka, ["in", "out", "dlq"], partitions=args.partitions)
        await produce_values(kafka, "in", [orjson.dumps(m) for m in messages], keys=[m["id"].encode() for m in messages])
        settings = RunSettings.model_validate({
            "bootstrap_servers": broker.bootstrap_servers, "input_topic": ["in"], "output_topic": "out",
            "dlq_topic": "dlq", "group_id": "bench", "token_budget": args.token_budget,
            "window_ms": args.window_ms, "max_batch_messages": args.max_batch_messages,
            "max_inflight": args.max_inflight, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
        })
        service = ScoringService(settings, engine)
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
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    messages = load_messages(args.dataset, args.n)
    engine = Engine.load(model=args.model, pack=args.pack, token_budget=args.token_budget, device=args.device)
    engine.score([Message(id=m["id"], fields=m) for m in messages[:16]])  # warm-up

    off1, offline_digests = time_offline(engine, messages)
    stream_s, service, stream_digests = asyncio.run(time_stream(engine, messages, args))
    off2, _ = time_offline(engine, messages)
    offline_s = (off1 + off2) / 2

    n = len(messages)
    st = service.stats
    same = sum(stream_digests.get(k) == v for k, v in offline_digests.items())
    print(f"model {engine.model_name}  pack {engine.pack.name}@{engine.pack.version}  device {args.device}  "
          f"messages {n} ({args.dataset})  token budget {args.token_budget}  window {args.window_ms} ms")
    print(f"{'path':<34}{'seconds':>10}{'msg/s':>10}")
    print(f"{'offline score (mean of 2)':<34}{offline_s:>10.2f}{n / offline_s:>10.1f}   ({off1:.2f} s, {off2:.2f} s)")
    print(f"{'stream via broker (end to end)':<34}{stream_s:>10.2f}{n / stream_s:>10.1f}   "
          f"({st.batches} batches, {st.batch_messages / max(st.batches, 1):.0f} msg/batch)")
    print(f"ratio stream / offline: {offline_s / stream_s:.3f}   (target >= 0.9)")
    print(f"digests equal to offline: {same}/{len(offline_digests)}")


if __name__ == "__main__":
    main()
