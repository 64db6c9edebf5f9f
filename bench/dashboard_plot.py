"""Plot what each Grafana panel shows, from a real run, without Grafana: ``docs/dashboard.png``.

    python bench/dashboard_plot.py                       # smollm2-135m, sms_spam, ~3 minutes on a CPU
    python bench/dashboard_plot.py --model /path/to/hf-dir --n 400 --out docs/dashboard.png

Runs the scorer service (the real engine, telemetry on, its HTTP endpoint on a free loopback port)
on an embedded broker, publishes real messages from ``../shared/data`` in two bursts with a few bad
inputs among them (so lag builds and drains, and the dead-letter panel has something to show),
scrapes ``/metrics`` every ``--scrape-s`` seconds as Prometheus would, then evaluates each panel's
queries of ``spinf_stream.telemetry.dashboard`` on the scraped samples — the same PromQL shapes
(rate, increase, histogram_quantile, gauge, mean, ratio) over a ``--window-s`` range — and draws
one subplot per panel. ``--samples FILE`` keeps the scraped samples (JSON lines) so that
``--replot`` can redraw the figure without a run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spinf_stream.config import RunSettings  # noqa: E402
from spinf_stream.stream.app import load_engine_timed  # noqa: E402
from spinf_stream.stream.engine_thread import EngineThread  # noqa: E402
from spinf_stream.stream.broker import EmbeddedBroker  # noqa: E402
from spinf_stream.stream.produce import produce_values  # noqa: E402
from spinf_stream.stream.service import ScoringService  # noqa: E402
from spinf_stream.stream.topics import ensure_topics  # noqa: E402
from spinf_stream.telemetry import create_telemetry  # noqa: E402
from spinf_stream.telemetry.dashboard import PANELS, Query  # noqa: E402
from spinf_stream.telemetry.metrics import BY_NAME  # noqa: E402
from spinf_stream.telemetry.server import OpsServer  # noqa: E402

Sample = tuple[str, dict[str, str], float]
BAD = [b"{not json", b"\xff\xfe", b'{"id": "x"}', b'{"id": "y", "text": "  "}']


def parse(text: str) -> list[Sample]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value)) for f in text_string_to_metric_families(text) for s in f.samples]


# -- a real run, scraped ---------------------------------------------------------------------------


async def record(args: argparse.Namespace) -> list[tuple[float, list[Sample]]]:
    rows = [orjson.loads(line) for _, line in zip(range(args.n), open(REPO.parent / "shared" / "data" / args.dataset / "dev.jsonl", "rb"))]
    values = [orjson.dumps(r) for r in rows]
    for i, bad in enumerate(BAD * 3):  # a few bad inputs among the good ones
        values.insert((i + 1) * len(values) // (len(BAD) * 3 + 1), bad)
    half = len(values) // 2
    scrapes: list[tuple[float, list[Sample]]] = []
    with EmbeddedBroker(port=0) as broker:
        kafka = {"bootstrap_servers": broker.bootstrap_servers}
        await ensure_topics(kafka, ["in", "out", "dlq"], partitions=3)
        settings = RunSettings.model_validate({
            "bootstrap_servers": broker.bootstrap_servers, "input_topic": ["in"], "output_topic": "out",
            "dlq_topic": "dlq", "group_id": "plot", "model": args.model, "pack": args.pack,
            "token_budget": args.token_budget, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000,
            "lag_interval_s": 1.0, "status_interval_s": 15, "metrics_port": 0,
        })
        telemetry = create_telemetry(settings, prometheus=True, environ={})
        server = OpsServer("127.0.0.1", 0, telemetry.health, telemetry.providers.registry).start()
        engine_thread = EngineThread()  # loads and runs every pass, as `run` does (one OpenMP team)
        engine = engine_thread.call(load_engine_timed, settings, telemetry)
        service = ScoringService(settings, engine, telemetry=telemetry, engine_thread=engine_thread)
        task = asyncio.create_task(service.run())
        await service.assigned.wait()
        t0 = time.monotonic()

        async def scrape_forever() -> None:
            while True:
                text = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
                )
                scrapes.append((time.monotonic() - t0, parse(text)))
                await asyncio.sleep(args.scrape_s)

        scraper = asyncio.create_task(scrape_forever())
        await asyncio.sleep(args.scrape_s * 3)
        await produce_values(kafka, "in", values[:half])
        await asyncio.sleep(args.gap_s)
        await produce_values(kafka, "in", values[half:])
        while service.stats.acked < len(values):
            await asyncio.sleep(0.5)
        await asyncio.sleep(args.window_s + 3 * args.scrape_s)  # let the rates fall back to 0
        scraper.cancel()
        service.stop()
        await task
        engine_thread.close()
        server.stop()
        telemetry.providers.shutdown()
    return scrapes


# -- the panels' queries on scraped samples --------------------------------------------------------


def _group(samples: list[Sample], name: str, labels: tuple[str, ...], extra: tuple[str, ...] = ()) -> dict[tuple, float]:
    out: dict[tuple, float] = defaultdict(float)
    for n, lab, v in samples:
        if n == name:
            out[tuple(lab.get(k, "") for k in labels + extra)] += v
    return out


def _delta(a: dict[tuple, float], b: dict[tuple, float]) -> dict[tuple, float]:
    return {k: v - a.get(k, 0.0) for k, v in b.items()}


def _quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket that holds rank q."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return float("nan")
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if b == float("inf"):
                return prev_b
            return prev_b + (b - prev_b) * (rank - prev_c) / (c - prev_c) if c > prev_c else b
        prev_b, prev_c = b, c
    return prev_b


def evaluate(query: Query, scrapes: list[tuple[float, list[Sample]]], window_s: float) -> dict[str, list[tuple[float, float]]]:
    """``{legend: [(t, value)]}`` of ``query`` at every scrape, as Prometheus would compute it."""
    spec = query.spec
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for i, (t, now) in enumerate(scrapes):
        j = next((k for k in range(i, -1, -1) if t - scrapes[k][0] >= window_s), None)
        dt = None if j is None else t - scrapes[j][0]
        then = None if j is None else scrapes[j][1]
        values: dict[tuple, float] = {}
        if query.shape == "gauge":
            for k, v in _group(now, spec.prometheus, query.labels).items():
                values[k] = v
        elif then is None or not dt:
            continue
        elif query.shape in ("rate", "increase"):
            d = _delta(_group(then, spec.prometheus, query.labels), _group(now, spec.prometheus, query.labels))
            values = {k: v / dt if query.shape == "rate" else v for k, v in d.items()}
        elif query.shape == "quantile":
            name = spec.prometheus + "_bucket"
            d = _delta(_group(then, name, query.labels, ("le",)), _group(now, name, query.labels, ("le",)))
            per: dict[tuple, dict[float, float]] = defaultdict(dict)
            for k, v in d.items():
                per[k[:-1]][float(k[-1])] = v
            values = {k: _quantile(query.q or 0.5, b) for k, b in per.items()}
        else:  # mean, ratio, one_minus_ratio
            if query.shape == "mean":
                num, den = spec.prometheus + "_sum", spec.prometheus + "_count"
            else:
                num, den = spec.prometheus, BY_NAME[query.other or ""].prometheus
            a = _delta(_group(then, num, query.labels), _group(now, num, query.labels))
            b = _delta(_group(then, den, query.labels), _group(now, den, query.labels))
            for k in a:
                if b.get(k):
                    r = a[k] / b[k]
                    values[k] = 1 - r if query.shape == "one_minus_ratio" else r
        for k, v in values.items():
            legend = query.legend
            for label, value in zip(query.labels, k):
                legend = legend.replace("{{" + label + "}}", value)
            legend = re.sub(r"\{\{[^}]*\}\}", "", legend).strip()
            out[legend].append((t, v))
    return out


def plot(scrapes: list[tuple[float, list[Sample]]], out: Path, window_s: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = -(-len(PANELS) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, PANELS):
        for q in panel.queries:
            for legend, points in evaluate(q, scrapes, window_s).items():
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], label=legend[:48], linewidth=1.4)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        ax.set_ylabel({"reqps": "per second", "s": "seconds", "percentunit": "share"}.get(panel.unit, ""), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6.5, loc="best")
    for ax in list(axes.flat)[len(PANELS):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=70)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--pack", default="spam")
    ap.add_argument("--dataset", default="sms_spam")
    ap.add_argument("--n", type=int, default=240, help="good messages (two bursts)")
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--gap-s", type=float, default=45.0, help="seconds between the two bursts")
    ap.add_argument("--scrape-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=20.0, help="range of rate() and histogram_quantile()")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    ap.add_argument("--samples", type=Path, help="JSON-lines file to save the scraped samples to (or to read with --replot)")
    ap.add_argument("--replot", action="store_true", help="redraw from --samples, no run")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.replot:
        if args.samples is None:
            ap.error("--replot needs --samples")
        scrapes = [(r["t"], [tuple(s) for s in r["samples"]]) for r in map(orjson.loads, args.samples.read_bytes().splitlines())]
    else:
        scrapes = asyncio.run(record(args))
        if args.samples is not None:
            args.samples.write_bytes(b"".join(orjson.dumps({"t": t, "samples": s}) + b"\n" for t, s in scrapes))
    title = (f"spinf-stream dashboard panels, plotted from /metrics scraped every {args.scrape_s:g} s "
             f"({args.model}, {args.pack}, {args.dataset}; rate window {args.window_s:g} s)")
    plot(scrapes, args.out, args.window_s, title)
    print(args.out)


if __name__ == "__main__":
    main()
