"""The engine pool: lanes of (pack, model) that load their models on demand under a memory budget.

Tiny random-weight models (``conftest.tiny_models``); records compared with those of
``Engine.load``, bit for bit; memory compared with the safetensors headers read here by hand.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
from pathlib import Path

import pytest

from spinf_stream.engine import Engine, Message
from spinf_stream.engine.pool import EnginePool, LaneEngine, ModelLoadFailed, usable_memory_bytes
from spinf_stream.engine.segment import PreparedMessage
from spinf_stream.stream.scorer import BoundsPrefixes, ReportsWork, Scorer

BUDGET = 1024  # tokens per pass: small, so that the KV part of an estimate is small too

MESSAGES = [
    Message(id="a", fields={"text": "WINNER!! You have been selected for a free cruise. Call 0800 123 456 now."}),
    Message(id="b", fields={"text": "Are we still on for lunch tomorrow? I can bring the slides."}),
    Message(id="c", fields={"text": "The battery died after two days. Would not buy again."}),
]
BAD = [
    Message(id="missing", fields={}),
    Message(id="wrong", fields={"text": 42}),
    Message(id="empty", fields={"text": "  \n "}),
]


@pytest.fixture(scope="module")
def models(tiny_models) -> dict[str, str]:
    return {f: str(tiny_models(f)) for f in ("llama", "qwen2", "mistral")}


@pytest.fixture(scope="module")
def reference(models):
    """``(pack, family) -> records`` of ``Engine.load`` for :data:`MESSAGES` (each engine once)."""
    memo: dict[tuple[str, str], list] = {}

    def get(pack: str, family: str) -> list:
        if (pack, family) not in memo:
            engine = Engine.load(model=models[family], pack=pack, token_budget=BUDGET)
            memo[pack, family] = [r.model_dump() for r in engine.score(MESSAGES)]
        return memo[pack, family]

    return get


def score(lane: LaneEngine, messages=MESSAGES) -> list[dict]:
    items = lane.prepare(messages)
    assert all(isinstance(p, PreparedMessage) for p in items)
    return [r.model_dump() for r in lane.run(items)]


def names(pool: EnginePool) -> list[str]:
    return [m.name for m in pool.loaded]


def header_elements(model_dir: str) -> int:
    """Elements of every tensor in the directory's safetensors files, from their JSON headers
    (8-byte little-endian length, then the header; safetensors' format)."""
    n = 0
    for f in Path(model_dir).glob("*.safetensors"):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        for name, t in header.items():
            if name != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                n += count
    return n


def kv_bytes(model_dir: str, tokens: int, element: int) -> int:
    """layers x 2 (k, v) x KV heads x head dim x tokens x bytes, from config.json."""
    c = json.loads((Path(model_dir) / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head_dim * tokens * element


# -- records ----------------------------------------------------------------------------------


def test_lane_records_equal_those_of_engine_load_and_packs_of_one_model_share_one_load(models, reference):
    pool = EnginePool()
    spam = pool.lane("spam", models["llama"], token_budget=BUDGET)
    sentiment = pool.lane("sentiment", models["llama"], token_budget=BUDGET)
    other = pool.lane("spam", models["qwen2"], token_budget=BUDGET)

    assert score(spam) == reference("spam", "llama")
    assert score(sentiment) == reference("sentiment", "llama")
    assert score(other) == reference("spam", "qwen2")
    assert pool.loads == 2
    assert names(pool) == [models["llama"], models["qwen2"]]
    assert spam.last_run.passes >= 1


def test_a_lane_is_a_scorer_that_bounds_prefixes_and_reports_work(models):
    lane = EnginePool().lane("spam", models["llama"], token_budget=BUDGET)
    assert isinstance(lane, Scorer) and isinstance(lane, BoundsPrefixes) and isinstance(lane, ReportsWork)


def test_prepare_loads_no_weights_and_equals_engine_prepare(models):
    pool = EnginePool()
    lane = pool.lane("spam", models["llama"], token_budget=BUDGET)
    items = lane.prepare(MESSAGES + BAD)
    assert pool.loaded == [] and pool.loads == 0 and not lane.loaded

    engine = Engine.load(model=models["llama"], pack="spam", token_budget=BUDGET)
    assert items == engine.prepare(MESSAGES + BAD)
    assert [type(i).__name__ for i in items[3:]] == ["ErrorRecord"] * 3
    text = MESSAGES[0].fields["text"] * 50
    assert lane.prefix_chars_bound(text) == engine.prefix_chars_bound(text)


def test_model_info_before_a_load_says_all_but_the_bits_probe_and_after_it_the_engines(models):
    pool = EnginePool()
    lane = pool.lane("spam", models["llama"], token_budget=BUDGET)
    engine = Engine.load(model=models["llama"], pack="spam", token_budget=BUDGET)
    before = lane.model_info
    assert before.model_dump(exclude={"numerics": {"bits_probe"}}) == \
        engine.model_info.model_dump(exclude={"numerics": {"bits_probe"}})
    assert before.numerics.bits_probe == "not_run"
    score(lane)
    assert lane.model_info == engine.model_info
    pool.evict(models["llama"])
    assert lane.model_info == engine.model_info  # kept across an unload


# -- budget and eviction ----------------------------------------------------------------------


def test_a_budget_for_one_model_evicts_the_other_and_a_lane_reloads_it(models, reference):
    pool = EnginePool()
    a = pool.lane("spam", models["llama"], token_budget=BUDGET)
    b = pool.lane("spam", models["qwen2"], token_budget=BUDGET)
    sizes = sorted(pool.estimate_bytes(models[f]) for f in ("llama", "qwen2"))
    pool.budget_bytes = sizes[1] + sizes[0] // 2  # one fits, two do not

    first = score(a)
    score(b)
    assert pool.evictions == 1 and names(pool) == [models["qwen2"]] and not a.loaded
    assert score(a) == first == reference("spam", "llama")
    assert pool.loads == 3 and pool.evictions == 2 and names(pool) == [models["llama"]]
    # each load's window: in order, disjoint, as long as its measured seconds
    windows = list(pool.load_windows)
    assert len(windows) == 3 and all(s0 <= e0 <= s1 for (s0, e0), (s1, _) in zip(windows, windows[1:]))
    assert [e - s for s, e in windows] == pytest.approx(list(pool.load_seconds), abs=0.01)


def test_a_budget_for_both_models_evicts_nothing(models):
    pool = EnginePool()
    a = pool.lane("spam", models["llama"], token_budget=BUDGET)
    b = pool.lane("sentiment", models["qwen2"], token_budget=BUDGET)
    pool.budget_bytes = pool.estimate_bytes(models["llama"]) + pool.estimate_bytes(models["qwen2"])
    score(a), score(b), score(a)
    assert pool.evictions == 0 and pool.loads == 2
    assert names(pool) == [models["qwen2"], models["llama"]]  # least recently used first


def test_the_least_recently_used_model_is_the_one_evicted(models):
    pool = EnginePool()
    lanes = {f: pool.lane("sentiment", models[f], token_budget=BUDGET) for f in ("llama", "qwen2", "mistral")}
    sizes = sorted(pool.estimate_bytes(m) for m in models.values())
    pool.budget_bytes = sizes[1] + sizes[2] + sizes[0] // 2  # any two fit, three do not

    score(lanes["llama"]), score(lanes["qwen2"]), score(lanes["llama"])  # qwen2 is now the older
    score(lanes["mistral"])
    assert names(pool) == [models["llama"], models["mistral"]]
    assert pool.evictions == 1 and not lanes["qwen2"].loaded


def test_a_model_over_the_budget_alone_still_loads_with_a_warning(models, reference, caplog):
    pool = EnginePool(budget_bytes=1)
    lane = pool.lane("spam", models["llama"], token_budget=BUDGET)
    with caplog.at_level(logging.WARNING, logger="spinf_stream.engine.pool"):
        assert score(lane) == reference("spam", "llama")
    assert names(pool) == [models["llama"]]
    assert any("more than the memory budget" in r.getMessage() for r in caplog.records)


def test_models_idle_for_idle_evict_s_are_unloaded(models, reference):
    now = [0.0]
    pool = EnginePool(idle_evict_s=60, clock=lambda: now[0])
    a = pool.lane("spam", models["llama"], token_budget=BUDGET)
    b = pool.lane("spam", models["qwen2"], token_budget=BUDGET)
    score(a)
    now[0] = 30.0
    assert pool.evict_idle() == []
    now[0] = 50.0
    score(b)
    now[0] = 70.0
    assert pool.evict_idle() == [models["llama"]]
    assert names(pool) == [models["qwen2"]] and pool.idle_evictions == 1 and not a.loaded
    assert [m.last_used for m in pool.loaded] == [50.0]
    assert score(a) == reference("spam", "llama") and pool.loads == 3


def test_evict_unloads_a_loaded_model_only(models):
    pool = EnginePool()
    lane = pool.lane("spam", models["llama"], token_budget=BUDGET)
    assert pool.evict(models["llama"]) is False
    pool.ensure(models["llama"])
    assert lane.loaded and pool.evict(models["llama"]) is True and pool.loaded == []
    with pytest.raises(KeyError, match="no lane"):
        pool.ensure(models["qwen2"])


# -- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["junk", "truncated"])
def test_a_corrupt_checkpoint_raises_model_load_failed_and_other_lanes_keep_working(
    models, reference, tmp_path, damage,
):
    broken = tmp_path / "broken-model"
    shutil.copytree(models["llama"], broken)
    (weights,) = broken.glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(b"\x13junk" * 1000 if damage == "junk" else data[: len(data) // 2])

    pool = EnginePool()
    bad = pool.lane("spam", str(broken), token_budget=BUDGET)  # registering reads no weights
    good = pool.lane("spam", models["qwen2"], token_budget=BUDGET)
    with pytest.raises(ModelLoadFailed, match="broken-model") as failed:
        bad.run([p for p in bad.prepare(MESSAGES)])
    assert failed.value.__cause__ is not None
    assert pool.load_failures == 1 and pool.loaded == [] and not bad.loaded

    assert score(good) == reference("spam", "qwen2")
    assert names(pool) == [models["qwen2"]]


# -- memory -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "mistral"])  # tied and untied embeddings
def test_estimate_bytes_before_a_load_is_the_measured_bytes_after_it(models, family):
    pool = EnginePool()
    lane = pool.lane("spam", models[family], token_budget=BUDGET)
    before = pool.estimate_bytes(models[family])
    score(lane)
    after = pool.estimate_bytes(models[family])
    assert pool.loaded[0].bytes == after

    kv = kv_bytes(models[family], BUDGET, 4)
    assert after - kv == header_elements(models[family]) * 4  # float32: the checkpoint's tensors
    assert abs(before - after) <= 0.01 * after  # stated factor: within 1 %


def test_estimate_bytes_of_int8_weights_is_within_one_percent_of_the_measured(models):
    pool = EnginePool(dtype="int8")
    lane = pool.lane("sentiment", models["mistral"], token_budget=BUDGET)
    before = pool.estimate_bytes(models["mistral"])
    score(lane)
    after = pool.estimate_bytes(models["mistral"])
    assert abs(before - after) <= 0.01 * after
    assert lane.model_info.dtype == "int8"


def test_the_budget_counts_the_largest_token_budget_of_a_models_lanes(models):
    pool = EnginePool()
    pool.lane("spam", models["llama"], token_budget=BUDGET)
    small = pool.estimate_bytes(models["llama"])
    pool.lane("sentiment", models["llama"], token_budget=4 * BUDGET)
    assert pool.estimate_bytes(models["llama"]) - small == kv_bytes(models["llama"], 3 * BUDGET, 4)


def test_usable_memory_is_the_machines_capped_by_the_cgroups_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:        1000 kB\n")
    group = tmp_path / "cgroup"
    group.mkdir()
    assert usable_memory_bytes(meminfo=meminfo, cgroup_root=group) == 16384000 * 1024
    (group / "memory.max").write_text("max\n")
    assert usable_memory_bytes(meminfo=meminfo, cgroup_root=group) == 16384000 * 1024
    (group / "memory.max").write_text("4294967296\n")
    assert usable_memory_bytes(meminfo=meminfo, cgroup_root=group) == 4294967296
