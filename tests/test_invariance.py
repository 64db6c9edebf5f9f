"""Batch invariance: a message's score record (digest and bytes) is identical whatever else is in
its forward passes, wherever it sits, whatever the token budget, and across processes."""

from __future__ import annotations

import random
import subprocess
import sys

import orjson
import pytest
from conftest import REPO, at_budget, dataset

from spinf_stream import calibration as cal
from spinf_stream.engine import Engine, Message
from spinf_stream.packs import load_pack
from spinf_stream.engine.results import digest


def _messages(data: str, n: int) -> list[Message]:
    return [Message(id=r["id"], fields=r) for r in dataset(data, n)]


def _bytes(records) -> dict[str, bytes]:
    return {r.id: orjson.dumps(r.model_dump()) for r in records}


@pytest.fixture(scope="module", params=["gemma3", "qwen2"])
def tiny_engine_factory(request, tiny_models, loaded):
    decoder, tok = loaded(tiny_models(request.param))

    def make(pack: str, budget: int, calibration: cal.Calibration | None = None) -> Engine:
        return Engine(decoder, tok, load_pack(pack), request.param, token_budget=budget, calibration=calibration)

    return make


def _calibration(pack: str) -> cal.Calibration:
    """A calibration of every question of ``pack`` (arbitrary but fixed maps, thresholds on binary ones)."""
    p = load_pack(pack)
    maps = {}
    for i, q in enumerate(p.expand()):
        k = len(q.choices)
        maps[q.id] = cal.QuestionCalibration(
            choices=q.choices, scale=tuple(0.7 + 0.1 * j for j in range(k)), bias=tuple(0.3 * (j - i) for j in range(k)),
            threshold=0.37 if k == 2 else None,
        )
    return cal.build(p, cal.ModelIdentity(name="tiny", weights_sha256="0" * 64), "vector", "accuracy", maps)


@pytest.mark.parametrize(("pack", "data"), [("spam", "sms_spam"), ("news_topics", "ag_news")])
def test_scores_identical_alone_shuffled_and_across_budgets(tiny_engine_factory, pack, data):
    msgs = _messages(data, 24)
    alone = {}
    e = tiny_engine_factory(pack, 16384)
    for m in msgs:
        alone.update(_bytes(e.score([m])))
    for budget in (1024, 4096, 16384):
        shuffled = msgs[:]
        random.Random(budget).shuffle(shuffled)
        got = _bytes(tiny_engine_factory(pack, budget).score(shuffled))
        assert got == alone, f"budget {budget}: {sum(got[k] != alone[k] for k in got)} records differ"


@pytest.mark.parametrize(("pack", "data"), [("spam", "sms_spam"), ("news_topics", "ag_news")])
def test_calibrated_scores_identical_alone_shuffled_and_across_budgets(tiny_engine_factory, pack, data):
    msgs = _messages(data, 24)
    calibration = _calibration(pack)
    alone = {}
    e = tiny_engine_factory(pack, 16384, calibration)
    for m in msgs:
        alone.update(_bytes(e.score([m])))
    first = orjson.loads(next(iter(alone.values())))
    assert first["calibration"] == calibration.id
    assert all("calibrated" in c for q in first["scores"].values() for c in q["choices"].values())
    for budget in (1024, 4096, 16384):
        shuffled = msgs[:]
        random.Random(budget).shuffle(shuffled)
        got = _bytes(tiny_engine_factory(pack, budget, calibration).score(shuffled))
        assert got == alone, f"budget {budget}: {sum(got[k] != alone[k] for k in got)} records differ"
    spread = _bytes(tiny_engine_factory(pack, 1, calibration).score(msgs[:4]))
    assert spread == {m.id: alone[m.id] for m in msgs[:4]}


def test_a_calibration_changes_the_digest_only_through_the_calibrated_scores(tiny_engine_factory):
    msgs = _messages("sms_spam", 3)
    raw = tiny_engine_factory("spam", 16384).score(msgs)
    calibrated = tiny_engine_factory("spam", 16384, _calibration("spam")).score(msgs)
    for r, c in zip(raw, calibrated):
        plain = orjson.loads(orjson.dumps(c.model_dump()))
        assert c.digest == digest(plain["scores"]) != r.digest
        for qid, q in plain["scores"].items():  # the raw numbers are untouched
            for label, ch in q["choices"].items():
                raw_ch = r.scores[qid].choices[label]
                assert (ch["probability"], ch["logprob"], ch["floor"]) == (raw_ch.probability, raw_ch.logprob, raw_ch.floor)


def test_branches_spread_over_passes_give_identical_scores(tiny_engine_factory):
    """A budget smaller than one message's content + branches splits its questions over passes."""
    msgs = _messages("ag_news", 6)
    whole = _bytes(tiny_engine_factory("sentiment", 16384).score(msgs))
    e = tiny_engine_factory("sentiment", 1)  # every pass: the content and one branch
    assert _bytes(e.score(msgs)) == whole


def test_digest_is_sha256_of_canonical_scores(tiny_engine_factory):
    import hashlib

    rec = tiny_engine_factory("spam", 16384).score(_messages("sms_spam", 1))[0]
    plain = orjson.loads(orjson.dumps(rec.model_dump()))
    want = "sha256:" + hashlib.sha256(orjson.dumps(plain["scores"], option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert rec.digest == want == digest(plain["scores"])


def test_scores_identical_across_processes(tiny_models, loaded, tmp_path):
    """Same model dir, same messages: another process (another batch mix) gives the same bytes."""
    path = tiny_models("llama")
    decoder, tok = loaded(path)
    msgs = _messages("sms_spam", 8)
    here = _bytes(Engine(decoder, tok, load_pack("spam"), "tiny").score(msgs))
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(dict(m.fields)) + b"\n" for m in reversed(msgs)))
    out = tmp_path / "out.jsonl"
    subprocess.run(
        [sys.executable, "-m", "spinf_stream.cli", "score", "--pack", "spam", "--input", str(inp), "--output", str(out),
         "--model", str(path), "--token-budget", "300", "--no-progress", "--device", "cpu", "--dtype", "float32"],
        check=True, cwd=REPO, capture_output=True,
    )
    there = {}
    for line in out.read_bytes().splitlines():
        rec = orjson.loads(line)
        assert (rec["model"]["device"], rec["model"]["dtype"]) == ("cpu", "float32")
        rec["model"] = {**rec["model"], "name": "tiny", "sha256": None}  # the in-process engine was built from tensors
        there[rec["id"]] = orjson.dumps(rec)
    assert there == here


# --------------------------------------------------------------------------- every family, every budget


BUDGETS = (64, 100, 256, 1024, 4096, 16384)


def _long_articles(n: int) -> list[Message]:
    """BBC articles cut to ~150 words: longer than the smaller budgets, inside the tiny models' context."""
    rows = dataset("bbc_news", n)
    return [Message(id=r["id"], fields={"title": r["title"], "text": " ".join(r["text"].split()[:150])}) for r in rows]


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_digests_are_equal_across_budgets_for_messages_longer_than_the_budget(tiny_models, loaded, family):
    """Issue 6's kind: a budget that splits a message's branches over passes (its content kept and
    carried) must not move a bit, for every family, with 56 questions per article."""
    decoder, tok = loaded(tiny_models(family))
    pack = load_pack(REPO / "bench" / "packs" / "bbc56.yaml")
    msgs = _long_articles(4)
    engine = Engine(decoder, tok, pack, family, token_budget=16384)
    alone = {}
    for m in msgs:
        alone.update(_bytes(engine.score([m])))
    longest = max(p.n_tokens for p in engine.prepare(msgs))
    assert longest > 4 * BUDGETS[0]
    for budget in BUDGETS:
        shuffled = msgs[:]
        random.Random(budget).shuffle(shuffled)
        got = _bytes(at_budget(engine, budget).score(shuffled))
        assert got == alone, f"budget {budget}: {sum(got[k] != alone[k] for k in got)} records differ"


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3", "gemma3"])
def test_scores_identical_whatever_the_number_of_compute_workers(tiny_models, loaded, family):
    """On the CPU every op runs single-threaded on one of the back end's workers; the number of
    workers (1 to 5 here, on however many cores) must not move a bit."""
    from spinf_stream.models import load_decoder

    _, tok = loaded(tiny_models(family))
    msgs = _messages("sms_spam", 6)
    got = {}
    for workers in (1, 2, 3, 5):
        decoder = load_decoder(tiny_models(family), threads=workers)
        got[workers] = _bytes(Engine(decoder, tok, load_pack("spam"), family, token_budget=120).score(msgs))
        decoder.backend.close()
    assert got[1] == got[2] == got[3] == got[5]
