"""Single-message API requests beside a stream backlog, side by side with each alone, in one run,
through an embedded Tansu broker and ``spinf-stream run`` subprocesses.

    python bench/api_latency.py --n 200 --requests 40
    python bench/api_latency.py --model qwen2.5-coder-0.5b --n 400 --requests 60

Three scenarios, one ``run`` process each, one after the other, on the same messages (the first
``--n`` of ``../shared/data/sms_spam/dev.jsonl``, and the next ``--requests`` as requests):

1. ``stream``: the backlog alone (published before the scorer starts); records/s from the
   scorer's API answering (its weights loaded) to the last scored record's broker timestamp;
2. ``api``: ``--requests`` single-message ``POST /v1/score`` requests, one at a time (a closed
   loop, so latency is service time plus the 5 ms window), with no backlog: requests/s, p50, p99;
3. ``both``: the same requests sent while the scorer works through the same backlog: the API's
   requests/s, p50 and p99, and the stream's records/s over the whole backlog.

Prints the figures, their ratios, and the load averages at start and end. Run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _messages(n: int) -> list[dict[str, Any]]:
    path = REPO.parent / "shared" / "data" / "sms_spam" / "dev.jsonl"
    with open(path, "rb") as f:
        rows = [orjson.loads(line) for _, line in zip(range(n), f)]
    if len(rows) < n:
        raise SystemExit(f"{path} has only {len(rows)} rows")
    return [{"id": r["id"], "text": r["text"]} for r in rows]


def _free_port() -> int:
    from spinf_stream.stream.broker import free_port

    return free_port()


def _start(boot: str, topic: str, model: str, budget: int, api_port: int, log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "spinf_stream.cli", "run", "--bootstrap-servers", boot, "--input-topic", topic,
            "--output-topic", f"{topic}.scores", "--dlq-topic", f"{topic}.dlq", "--group-id", f"bench-{uuid.uuid4().hex[:8]}",
            "--pack", "spam", "--model", model, "--token-budget", str(budget), "--metrics-port", "0",
            "--api-port", str(api_port), "--device", "cpu", "--dtype", "float32", "--session-timeout-ms", "6000",
            "--heartbeat-interval-ms", "500"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _wait_api(port: int, proc: subprocess.Popen[bytes], log: Path) -> str:
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the scorer did not serve its API:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _requests(url: str, msgs: list[dict[str, Any]]) -> dict[str, float]:
    lat = []
    t0 = time.perf_counter()
    with httpx.Client(timeout=120) as client:
        for m in msgs:
            s = time.perf_counter()
            r = client.post(f"{url}/v1/score", json={"pack": "spam", "messages": [m]})
            r.raise_for_status()
            lat.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return {"requests_per_s": len(msgs) / wall, "p50_s": q[49], "p99_s": q[98]}


async def _scored(boot: str, topic: str, n: int, ready: float) -> dict[str, float]:
    """Records/s of the backlog: ``n`` over the time from the scorer's API answering (weights
    loaded; ``ready``, Unix seconds) to the last record's broker timestamp (the group's join is
    inside, the same in both scenarios)."""
    from spinf_stream.stream.consume import read_topics

    stamps = [rec.timestamp async for rec in read_topics({"bootstrap_servers": boot}, [f"{topic}.scores"], max_records=n)]
    return {"records": n, "records_per_s": n / (max(stamps) / 1000 - ready)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="backlog messages")
    ap.add_argument("--requests", type=int, default=40, help="single-message API requests per scenario")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--token-budget", type=int, default=4096)
    args = ap.parse_args()
    from spinf_stream.stream.broker import EmbeddedBroker
    from spinf_stream.stream.produce import produce_values
    from spinf_stream.stream.topics import ensure_topics

    msgs = _messages(args.n + args.requests)
    backlog, asked = msgs[: args.n], msgs[args.n :]
    load0 = os.getloadavg()
    print(f"model {args.model}, pack spam, token budget {args.token_budget}, backlog {args.n}, {args.requests} requests, "
          f"{os.cpu_count()} CPUs, load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    out: dict[str, dict[str, float]] = {}
    with EmbeddedBroker(port=0) as broker, tempfile.TemporaryDirectory() as tmp:
        boot = broker.bootstrap_servers
        kafka = {"bootstrap_servers": boot}
        for scenario in ("stream", "api", "both"):
            topic = f"in-{scenario}"
            asyncio.run(ensure_topics(kafka, [topic, f"{topic}.scores", f"{topic}.dlq"], 3))
            if scenario != "api":
                asyncio.run(produce_values(kafka, topic, [orjson.dumps(m) for m in backlog]))
            port = _free_port()
            log = Path(tmp) / f"{scenario}.log"
            proc = _start(boot, topic, args.model, args.token_budget, port, log)
            try:
                url = _wait_api(port, proc, log)
                ready = time.time()
                out[scenario] = _requests(url, asked) if scenario != "stream" else {}
                if scenario != "api":
                    out[scenario].update(asyncio.run(_scored(boot, topic, args.n, ready)))
            finally:
                proc.terminate()
                proc.wait(120)
            print(scenario, {k: round(v, 4) for k, v in out[scenario].items()}, flush=True)
    s, a, b = out["stream"], out["api"], out["both"]
    print("\n| scenario | API requests/s | API p50 (s) | API p99 (s) | stream records/s |\n|---|---:|---:|---:|---:|")
    print(f"| stream alone | – | – | – | {s['records_per_s']:.2f} |")
    print(f"| API alone | {a['requests_per_s']:.2f} | {a['p50_s']:.3f} | {a['p99_s']:.3f} | – |")
    print(f"| both | {b['requests_per_s']:.2f} | {b['p50_s']:.3f} | {b['p99_s']:.3f} | {b['records_per_s']:.2f} |")
    print(f"\nAPI p50 with a backlog / alone: {b['p50_s'] / a['p50_s']:.2f}x; p99: {b['p99_s'] / a['p99_s']:.2f}x; "
          f"stream records/s with API requests / alone: {b['records_per_s'] / s['records_per_s']:.2f}x")
    load1 = os.getloadavg()
    print(f"load average at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
