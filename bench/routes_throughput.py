"""Many packs and models in one service (``--routes``) against one service per pack, side by side
in one run, through an embedded Tansu broker.

    python bench/routes_throughput.py --n 100
    python bench/routes_throughput.py --n 400 --model-a qwen2.5-coder-0.5b --model-b smollm2-135m

Each scenario runs in a process of its own (so that its peak resident memory is its own), one
after the other, on the same messages (the first ``--n`` of ``../shared/data/sms_spam/dev.jsonl``,
already published before the timer starts); each is timed from its first consumed record to the
broker's acknowledgement of its last written record (group join and the first model loads
excluded):

1. ``sequential``: the packs ``spam`` and ``sentiment`` on model A, one service per pack in turn
   (two engines, two loads of A: today's way to run two packs), times summed;
2. ``two-packs``: both packs on model A through one routed service (one load, two lanes);
3. ``two-models``: ``spam`` on model A (topic 1) and ``sentiment`` on model B (topic 2) through one
   routed service, the memory budget fitting both;
4. ``swapping``: the same with a budget that fits one model: every switch of model is a load
   (the swap cost: loads, their seconds, and the extra wall time against ``two-models``).

It prints records/s (written records: one per message and pack), the engine pool's loads,
evictions and load seconds, peak RSS, and the load averages at start and end. Run it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCENARIOS = ("sequential", "two-packs", "two-models", "swapping")


def _messages(n: int) -> list[dict[str, Any]]:
    path = REPO.parent / "shared" / "data" / "sms_spam" / "dev.jsonl"
    with open(path, "rb") as f:
        rows = [orjson.loads(line) for _, line in zip(range(n), f)]
    if len(rows) < n:
        raise SystemExit(f"{path} has only {len(rows)} rows")
    return [{"id": r["id"], "text": r["text"]} for r in rows]


async def _run_routes(bootstrap: str, routes: dict[str, Any], values: dict[str, list[bytes]], budget_gib: float | None,
                      swap_wait_s: float) -> dict[str, Any]:
    """Publish ``values`` (by topic), then score them with one routed service; its timings."""
    from spinf_stream.config import RunSettings
    from spinf_stream.engine.pool import EnginePool
    from spinf_stream.routes import RoutesFile
    from spinf_stream.stream.app import prepare_engine_thread
    from spinf_stream.stream.engine_thread import EngineThread
    from spinf_stream.stream.produce import produce_values
    from spinf_stream.stream.routing import router_for
    from spinf_stream.stream.service import ScoringService
    from spinf_stream.stream.topics import ensure_topics

    file = RoutesFile.model_validate(routes)
    kafka = {"bootstrap_servers": bootstrap}
    await ensure_topics(kafka, [*file.input_topics, *{r.output_topic for r in file.routes}, file.dead_letter_topic], 3)
    owed = 0
    for route in file.routes:
        for topic in route.topics:
            await produce_values(kafka, topic, values[topic])
            owed += len(values[topic]) * len(route.packs)
    with EngineThread() as engine:
        threads = engine.call(prepare_engine_thread)
        pool = EnginePool(threads=threads, budget_bytes=int(budget_gib * 2**30) if budget_gib else None)
        lanes = {k: engine.call(pool.lane, p.pack, p.model, token_budget=p.token_budget) for k, p in file.lanes().items()}
        t0 = time.perf_counter()
        for route in file.routes:
            engine.call(pool.ensure, route.packs[0].model)
        first_loads_s = time.perf_counter() - t0
        loads0, evictions0, load_s0 = pool.loads, pool.evictions, pool.load_seconds_total
        router = router_for(file, {k: (str(s.pack.name), str(s.pack.version)) for k, s in lanes.items()})
        settings = RunSettings.model_validate({
            "bootstrap_servers": bootstrap, "group_id": f"bench-{uuid.uuid4().hex[:8]}", "dlq_topic": file.dead_letter_topic,
            "enable_idempotence": False, "metrics_port": 0, "device": "cpu", "dtype": "float32",
        })
        waits = _waits_telemetry()
        svc = ScoringService(settings, lanes=lanes, router=router, engine_thread=engine, housekeeping=pool.evict_idle,
                             budgets={k: p.token_budget for k, p in file.lanes().items()}, swap_wait_s=swap_wait_s,
                             telemetry=waits)
        task = asyncio.create_task(svc.run())
        await svc.wait_acked(owed)
        wall = (svc.stats.last_acked_at or time.monotonic()) - (svc.stats.first_consumed_at or 0.0)
        svc.stop()
        await task
    return {"records": owed, "wall_s": wall, "engine_s": svc.stats.engine_seconds, "batches": svc.stats.batches,
            "first_loads_s": first_loads_s, "loads": pool.loads - loads0, "evictions": pool.evictions - evictions0,
            "load_s": pool.load_seconds_total - load_s0, **_delayed(waits.windows, list(pool.load_windows)[loads0:])}


def _delayed(waits: list[tuple[float, float]], loads: list[tuple[float, float]]) -> dict[str, Any]:
    """Records whose wait (read → their batch starts) overlapped a model load, and the seconds
    of load inside their waits (the engine thread runs no batch while it loads)."""
    overlaps = [sum(max(0.0, min(e, le) - max(s, ls)) for ls, le in loads) for s, e in waits]
    hit = [o for o in overlaps if o > 0]
    return {"delayed_records": len(hit), "delayed_s_mean": sum(hit) / len(hit) if hit else 0.0,
            "waited_records": len(waits)}


def _waits_telemetry() -> Any:
    from spinf_stream.telemetry.recorder import StreamTelemetry

    class Waits(StreamTelemetry):
        """Keeps each record's wait, ``(read, its batch starts)`` in ``time.monotonic()`` seconds."""

        def __init__(self) -> None:
            super().__init__()
            self.windows: list[tuple[float, float]] = []

        def batch_started(self, headers: Any, waited_s: Any, tokens: int, **lane: Any) -> Any:
            now = time.monotonic()
            self.windows.extend((now - w, now) for w in waited_s)
            return super().batch_started(headers, waited_s, tokens, **lane)

    return Waits()


def _child(args: argparse.Namespace) -> None:
    """One scenario (in its own process); prints its result as one JSON line."""
    import logging

    from spinf_stream.engine.pool import EnginePool
    from spinf_stream.stream.broker import EmbeddedBroker

    logging.basicConfig(level=logging.WARNING)
    msgs = _messages(args.n)
    values = [orjson.dumps(m) for m in msgs]
    a, b = args.model_a, args.model_b
    budget = args.token_budget
    out: dict[str, Any] = {"scenario": args.scenario}
    with EmbeddedBroker(port=0) as broker:
        boot = broker.bootstrap_servers

        def routes(*rs: dict[str, Any]) -> dict[str, Any]:
            return {"dead_letter_topic": "dlq", "routes": list(rs)}

        def route(topic: str, *packs: tuple[str, str], out_topic: str = "scores.{pack}") -> dict[str, Any]:
            return {"topics": [topic], "output_topic": out_topic,
                    "packs": [{"pack": p, "model": m, "token_budget": budget} for p, m in packs]}

        if args.scenario == "sequential":
            parts = []
            for i, pack in enumerate(("spam", "sentiment")):
                parts.append(asyncio.run(_run_routes(boot, routes(route(f"in{i}", (pack, a))), {f"in{i}": values}, None, 2.0)))
            out.update({k: sum(p[k] for p in parts) for k in parts[0]})
        elif args.scenario == "two-packs":
            out.update(asyncio.run(_run_routes(boot, routes(route("in", ("spam", a), ("sentiment", a))), {"in": values}, None, 2.0)))
        else:
            half = len(values) // 2
            sizes = EnginePool()
            for m in (a, b):
                sizes.lane("spam", m, token_budget=budget)
            est = {m: sizes.estimate_bytes(m) for m in (a, b)}
            gib = (sum(est.values()) if args.scenario == "two-models" else max(est.values())) * 1.01 / 2**30
            out["budget_gib"] = gib
            out.update(asyncio.run(_run_routes(
                boot, routes(route("in1", ("spam", a)), route("in2", ("sentiment", b))),
                {"in1": values[:half], "in2": values[half:]}, gib, args.swap_wait_s)))
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100, help="messages (each scored by each pack of its route)")
    ap.add_argument("--model-a", default="qwen2.5-coder-0.5b")
    ap.add_argument("--model-b", default="smollm2-135m")
    ap.add_argument("--token-budget", type=int, default=4096)
    ap.add_argument("--swap-wait-s", type=float, default=2.0)
    ap.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)  # the child's
    args = ap.parse_args()
    if args.scenario:
        _child(args)
        return
    load0 = os.getloadavg()
    print(f"{args.n} sms_spam messages, models A={args.model_a} B={args.model_b}, token budget {args.token_budget}, "
          f"{os.cpu_count()} CPUs, load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    rows = []
    for s in SCENARIOS:
        with tempfile.TemporaryDirectory():
            proc = subprocess.run([sys.executable, __file__, "--scenario", s, "--n", str(args.n), "--model-a", args.model_a,
                                   "--model-b", args.model_b, "--token-budget", str(args.token_budget),
                                   "--swap-wait-s", str(args.swap_wait_s)],
                                  capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"scenario {s} failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"| scenario | records | wall s | records/s | engine s | batches | loads | evictions | load s | peak RSS GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['scenario']} | {r['records']} | {r['wall_s']:.1f} | {r['records'] / r['wall_s']:.2f} | "
              f"{r['engine_s']:.1f} | {r['batches']} | {r['loads']} | {r['evictions']} | {r['load_s']:.1f} | "
              f"{r['peak_rss_gib']:.2f} |")
    by = {r["scenario"]: r for r in rows}
    seq, two = by["sequential"], by["two-packs"]
    print(f"two packs in one service / one service per pack in turn (records/s): "
          f"{(two['records'] / two['wall_s']) / (seq['records'] / seq['wall_s']):.2f}")
    sw, tm = by["swapping"], by["two-models"]
    print(f"records delayed by a swap: {sw['delayed_records']} of {sw['waited_records']} waited through a load, "
          f"{sw['delayed_s_mean']:.2f} s of load each on average (two-models: {tm['delayed_records']})")
    print(f"swap cost: {sw['loads']} loads ({sw['load_s']:.1f} s loading), wall {sw['wall_s']:.1f} s vs "
          f"{tm['wall_s']:.1f} s with both models in memory (+{sw['wall_s'] - tm['wall_s']:.1f} s); "
          f"peak RSS {sw['peak_rss_gib']:.2f} vs {tm['peak_rss_gib']:.2f} GiB")
    load1 = os.getloadavg()
    print(f"load average at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


if __name__ == "__main__":
    main()
