"""Helpers of the telemetry tests: a service with its real HTTP endpoint, and scraping it."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from spinf_stream.telemetry import StreamTelemetry, create_telemetry
from spinf_stream.telemetry.server import OpsServer


@dataclass(frozen=True)
class Scrape:
    """One scrape of ``/metrics``: every sample as (name, labels, value)."""

    text: str
    samples: tuple[tuple[str, dict[str, str], float], ...]

    def names(self) -> set[str]:
        return {name for name, _, _ in self.samples}

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(v for n, lab, v in self.samples if n == name and all(lab.get(k) == x for k, x in labels.items()))

    def by(self, name: str, label: str) -> dict[str, float]:
        """``{label value: summed value}`` of ``name``."""
        out: dict[str, float] = {}
        for n, lab, v in self.samples:
            if n == name and label in lab:
                out[lab[label]] = out.get(lab[label], 0.0) + v
        return out

    def has(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.samples)


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.append((s.name, dict(s.labels), float(s.value)))
    return Scrape(text, tuple(samples))


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """``(HTTP status, JSON body)`` of ``/healthz`` or ``/readyz``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read())


@contextmanager
def served(settings: Any, **kwargs: Any) -> Iterator[tuple[StreamTelemetry, int]]:
    """Telemetry for ``settings`` (Prometheus reader on) and its endpoint on a free loopback port."""
    telemetry = create_telemetry(settings, prometheus=True, **kwargs)
    server = OpsServer("127.0.0.1", 0, telemetry.health, telemetry.providers.registry).start()
    try:
        yield telemetry, server.port
    finally:
        server.stop()
        telemetry.providers.shutdown()
