"""Routes: the file (validation naming file and key), the router (first match, header match,
``spinf-pack`` narrowing, ``unknown_pack``, ``no_route``) and the scheduling policy across lanes
(oldest first, loaded first, fairness cap)."""

from __future__ import annotations

from pathlib import Path

import pytest

from spinf_stream.errors import UsageError
from spinf_stream.messages import Rejection
from spinf_stream.routes import RoutesFile, check_routes, load_routes, single_route
from spinf_stream.stream.routing import router_for
from spinf_stream.stream.scheduler import Scheduler

def _readme_example() -> str:
    """The routes file of the README ("Many packs and models"), and a last route that takes the rest."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("### Many packs and models"):]
    block = section[section.index("```yaml\n") + 8:section.index("```", section.index("```yaml\n") + 8)]
    return block + "  - topics: [reviews, messages]\n    packs: [spam]\n"


ISSUE_EXAMPLE = _readme_example()


@pytest.fixture
def example(tmp_path: Path) -> tuple[RoutesFile, str]:
    p = tmp_path / "routes.yaml"
    p.write_text(ISSUE_EXAMPLE)
    return load_routes(p), str(p)


def _router(routes: RoutesFile):
    packs = {k: (p.pack, "1.0.0") for k, p in routes.lanes().items()}
    return router_for(routes, packs)


def test_the_issue_s_example_loads_with_its_lanes_topics_and_outputs(example):
    routes, path = example
    assert routes.dead_letter_topic == "scores.dlq"
    assert routes.input_topics == ["messages", "reviews"]
    assert [p.pack for p in routes.lanes().values()] == ["spam", "moderation", "sentiment"]  # spam@qwen once
    router = _router(routes)
    assert router.output_topics == ["scores.spam", "scores.moderation", "review-scores", "scores"]
    packs = check_routes(routes, path, models=False)
    assert {p.name for p in packs.values()} == {"spam", "moderation", "sentiment"}


def test_a_record_goes_to_the_first_route_that_takes_it(example):
    router = _router(example[0])
    msg = router.route("messages", [])
    assert [(t.pack_name, t.output_topic) for t in msg] == [("spam", "scores.spam"), ("moderation", "scores.moderation")]
    shop = router.route("reviews", [("spinf-source", b"shop"), ("x", None)])
    assert [(t.pack_name, t.output_topic) for t in shop] == [("sentiment", "review-scores")]
    other = router.route("reviews", [("spinf-source", b"blog")])  # the header does not match: the last route
    assert [(t.pack_name, t.output_topic) for t in other] == [("spam", "scores")]
    none = router.route("elsewhere", [])
    assert isinstance(none, Rejection) and none.kind == "no_route" and "elsewhere" in none.message


@pytest.mark.parametrize(("header", "packs"), [
    (b"spam", ["spam"]),
    (b"moderation@1.0.0", ["moderation"]),
    (b" moderation , spam ", ["spam", "moderation"]),  # the route's order, each once
    (b"spam,spam@1.0.0", ["spam"]),
])
def test_the_pack_header_narrows_a_record_to_the_packs_it_names(example, header, packs):
    got = _router(example[0]).route("messages", [("spinf-pack", header)])
    assert not isinstance(got, Rejection), got
    assert [t.pack_name for t in got] == packs


@pytest.mark.parametrize(("header", "text"), [
    (b"sentiment", "'sentiment'; its route scores spam@1.0.0, moderation@1.0.0"),
    (b"spam,sentiment", "'sentiment'"),
    (b"spam@9.9.9", "'spam@9.9.9'"),
    (b"spam,", "empty pack"),
    (b"\xff", "not valid UTF-8"),
])
def test_a_pack_the_route_does_not_allow_is_unknown_pack_naming_those_allowed(example, header, text):
    got = _router(example[0]).route("messages", [("spinf-pack", header)])
    assert isinstance(got, Rejection) and got.kind == "unknown_pack"
    assert text in got.message


def test_the_flags_make_one_route_with_a_literal_output_topic():
    r = single_route(input_topics=["a", "b"], output_topic="out{x}", dlq_topic="d", pack="spam",
                     model="m", token_budget=128, calibration="none")
    router = router_for(r, {p: ("spam", "1.4.0") for p in r.lanes()})
    assert [t.output_topic for t in router.route("b", [])] == ["out{x}"]


@pytest.mark.parametrize(("text", "where"), [
    ("routes: []\n", "routes: List should have at least 1 item"),
    ("routes:\n  - topics: []\n    packs: [spam]\n", "routes[0].topics"),
    ("routes:\n  - topics: [a]\n    packs: [{pack: spam, token_budget: 8}]\n", "routes[0].packs[0].token_budget"),
    ("routes:\n  - topics: [a]\n    packs: [spam]\n    header: {k: 1}\n", "routes[0].header.k"),
    ("routes:\n  - topics: [a]\n    packs: [spam]\n    output_topic: '{pack'\n", "routes[0].output_topic"),
    ("dead_letter_topic: d\n", "routes: Field required"),
    ("- a\n", "must be a mapping"),
])
def test_a_bad_routes_file_names_the_file_and_the_key(tmp_path, text, where):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(UsageError) as e:
        load_routes(p)
    assert str(p) in str(e.value) and where in str(e.value), str(e.value)


def test_an_unknown_model_in_a_routes_file_names_the_key(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("routes:\n  - topics: [a]\n    packs: [spam, {pack: sentiment, model: no-such-model}]\n")
    routes = load_routes(p)
    check_routes(routes, p, models=False)
    with pytest.raises(UsageError) as e:
        check_routes(routes, p)
    assert "routes[0].packs[1].model" in str(e.value) and "no-such-model" in str(e.value)


# -- the scheduling policy -----------------------------------------------------------------------


def _scheduler(loaded: set[str], cap: int = 4, swap_wait_s: float = 2.0) -> Scheduler[str]:
    # window 0: a batch is ready as soon as it has a message; budget 100 tokens, cap 2 messages
    return Scheduler({"a": 100, "b": 100, "c": 100}, 2, 0.0, loaded=lambda lane: lane in loaded, fairness_cap=cap,
                     swap_wait_s=swap_wait_s, clock=lambda: 0.0)


def test_the_oldest_ready_batch_runs_first_ties_to_the_lane_listed_first():
    s = _scheduler({"a", "b", "c"})
    s.add("b", "b1", 10, now=1.0)
    s.add("c", "c1", 10, now=1.0)
    s.add("a", "a1", 10, now=2.0)
    order = [s.take(now=3.0) for _ in range(3)]
    assert order == [("b", ["b1"]), ("c", ["c1"]), ("a", ["a1"])]
    assert s.take(now=3.0) is None


def test_a_busy_lane_yields_to_a_quiet_one_after_the_fairness_cap():
    s = _scheduler({"a", "b", "c"}, cap=3)
    for i in range(20):  # a's batches (2 messages each) are all older than b's one
        s.add("a", f"a{i}", 10, now=float(i) / 100)
    s.add("b", "b0", 10, now=1.0)
    lanes = [s.take(now=2.0)[0] for _ in range(5)]  # type: ignore[index]
    assert lanes == ["a", "a", "a", "b", "a"]


def test_loaded_lanes_go_first_until_a_cold_lane_has_waited_swap_wait():
    s = _scheduler({"a"}, swap_wait_s=2.0)
    s.add("b", "b0", 10, now=0.0)  # older, but its model is not loaded
    s.add("a", "a0", 10, now=0.5)
    s.add("a", "a1", 10, now=0.5)
    s.add("a", "a2", 10, now=0.6)
    assert s.take(now=1.0) == ("a", ["a0", "a1"])
    assert s.take(now=2.5) == ("b", ["b0"])  # b has waited 2.5 s >= 2 s: the oldest runs
    assert s.take(now=2.5) == ("a", ["a2"])


def test_a_cold_lane_runs_at_once_when_no_loaded_lane_has_a_batch():
    s = _scheduler(set())
    s.add("c", "c0", 10, now=0.0)
    assert s.take(now=0.0) == ("c", ["c0"])


def test_discard_and_depths_cover_every_lane():
    s = _scheduler({"a", "b"})
    s.add("a", "x1", 10, now=0.0)
    s.add("b", "y1", 10, now=0.0)
    s.add("b", "x2", 10, now=0.0)
    assert s.depths() == {"a": 1, "b": 2, "c": 0}
    assert sorted(s.discard(lambda it: it.startswith("x"))) == ["x1", "x2"]
    assert len(s) == 1
