"""Routing: which (pack, model) lanes score a consumed record, and where each record goes.

A :class:`Router` holds the routes of a routes file (:mod:`spinf_stream.routes`), each bound to
its lanes' packs. A record belongs to the first route whose topics hold it and whose header
match it carries; it owes one written record per :class:`Target` of that route. A ``spinf-pack``
header (``name`` or ``name@version``, comma-separated for several) narrows the targets to the
packs it names; naming a pack the route does not allow is ``unknown_pack`` (the message lists the
packs allowed), and a record no route takes is ``no_route``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spinf_stream.messages import Rejection
from spinf_stream.stream.codec import PACK_HEADER

if TYPE_CHECKING:
    from spinf_stream.routes import RoutesFile

__all__ = ["Router", "StreamRoute", "Target", "router_for"]


@dataclass(frozen=True, slots=True)
class Target:
    """One record a consumed record owes: scored by ``lane`` (pack ``name@version``), written to
    ``output_topic``."""

    lane: str
    pack_name: str
    pack_version: str
    output_topic: str


@dataclass(frozen=True, slots=True)
class StreamRoute:
    """A route: its input topics, the headers a record must carry (exact bytes), its targets."""

    topics: frozenset[str]
    header: tuple[tuple[str, bytes], ...]
    targets: tuple[Target, ...]

    def takes(self, topic: str, headers: Sequence[tuple[str, bytes | None]] | None) -> bool:
        if topic not in self.topics:
            return False
        have = {(k, bytes(v) if v is not None else None) for k, v in headers or ()}
        return all(h in have for h in self.header)


class Router:
    """Routes records to their targets (see the module docstring)."""

    def __init__(self, routes: Sequence[StreamRoute]) -> None:
        if not routes:
            raise ValueError("a router needs at least one route")
        self.routes = tuple(routes)

    @property
    def output_topics(self) -> list[str]:
        """Every target's output topic, each once."""
        return list(dict.fromkeys(t.output_topic for r in self.routes for t in r.targets))

    def candidates(self, topic: str, headers: Sequence[tuple[str, bytes | None]] | None) -> tuple[Target, ...]:
        """Every target of the route that takes the record (``()`` when none does), whatever its
        ``spinf-pack`` header asks."""
        route = next((r for r in self.routes if r.takes(topic, headers)), None)
        return route.targets if route is not None else ()

    def route(self, topic: str, headers: Sequence[tuple[str, bytes | None]] | None) -> tuple[Target, ...] | Rejection:
        """The targets a record of ``topic`` with ``headers`` owes, or why it has none
        (``no_route``, ``unknown_pack``). Never raises for bad input."""
        route = next((r for r in self.routes if r.takes(topic, headers)), None)
        if route is None:
            return Rejection("no_route", f"no route takes records of topic {topic!r} with these headers")
        wanted = _asked_packs(headers)
        if isinstance(wanted, Rejection) or wanted is None:
            return wanted if wanted is not None else route.targets
        chosen: list[Target] = []
        for name, version in wanted:
            hits = [t for t in route.targets if t.pack_name == name and (not version or t.pack_version == version)]
            if not hits:
                allowed = ", ".join(dict.fromkeys(f"{t.pack_name}@{t.pack_version}" for t in route.targets))
                asked = f"{name}@{version}" if version else name
                return Rejection("unknown_pack", f"the record asks for pack {asked[:200]!r}; its route scores {allowed}")
            chosen.extend(t for t in hits if t not in chosen)
        return tuple(t for t in route.targets if t in chosen)  # in the route's order


def _asked_packs(headers: Sequence[tuple[str, bytes | None]] | None) -> list[tuple[str, str]] | Rejection | None:
    """``[(name, version or "")]`` of the ``spinf-pack`` headers, ``None`` when there is none."""
    asked: list[tuple[str, str]] | None = None
    for key, raw in headers or ():
        if key != PACK_HEADER:
            continue
        try:
            text = (raw or b"").decode("utf-8")
        except UnicodeDecodeError:
            return Rejection("unknown_pack", "the spinf-pack header is not valid UTF-8")
        asked = asked if asked is not None else []
        for part in text.split(","):
            name, _, version = part.strip().partition("@")
            if not name:
                return Rejection("unknown_pack", "the spinf-pack header names an empty pack")
            asked.append((name, version.strip()))
    return asked


def router_for(routes: RoutesFile, packs: Mapping[str, tuple[str, str]]) -> Router:
    """The router of a routes file; ``packs``: ``(name, version)`` of each lane's pack, by lane key."""
    out = []
    for r in routes.routes:
        targets = []
        for p in r.packs:
            name, version = packs[p.lane]
            t = Target(p.lane, name, version, r.output_for(name, p))
            if t not in targets:
                targets.append(t)
        header = tuple((k, v.encode("utf-8")) for k, v in (r.header or {}).items())
        out.append(StreamRoute(frozenset(r.topics), header, tuple(targets)))
    return Router(out)
