"""Parity with transformers on real models and real messages: every question of the three
shipped packs of ``PACK_DATA``, 6 messages each, for Gemma 3 270M, SmolLM2-135M and
Qwen2.5-Coder-0.5B: each model on two packs and each pack on two models (``CASES``; the random-weight
models of every family read spam and news_topics in ``tests/test_families.py``).

Tolerances (fp32): |Δprobability| ≤ 2e-4, |Δlogprob| ≤ 1e-3.
"""

from __future__ import annotations

import pytest
from conftest import PACK_DATA, dataset
from oracle import Oracle, load_hf, probabilities

from spinf_stream.engine import Engine, Message
from spinf_stream.packs import load_pack

pytestmark = pytest.mark.real_model

MODELS = ["smollm2-135m", "gemma-3-270m", "qwen2.5-coder-0.5b"]
N_MESSAGES = 6
#: (model, pack): model i reads packs i and i + 1 of PACK_DATA
CASES = [(m, p) for i, m in enumerate(MODELS) for p in (list(PACK_DATA) * 2)[i:i + 2]]
#: messages per pack also checked against transformers WITHOUT its own prefix cache
N_NO_CACHE = 2


@pytest.fixture(scope="module")
def real(loaded):
    from spinf_stream.models.resolve import resolve

    memo = {}

    def get(name: str):
        if name not in memo:
            path = resolve(name).path
            decoder, tok = loaded(path)
            memo.clear()  # one real model in memory at a time
            memo[name] = (decoder, tok, load_hf(str(path)))
        return memo[name]

    return get


@pytest.mark.parametrize(("model", "pack_name"), CASES)
def test_engine_matches_transformers_on_real_messages(real, model, pack_name):
    decoder, tok, hf = real(model)
    pack = load_pack(pack_name)
    rows = dataset(PACK_DATA[pack_name], N_MESSAGES)
    engine = Engine(decoder, tok, pack, model)
    records = engine.score([Message(id=r["id"], fields=r) for r in rows])
    oracle = Oracle(hf, tok, pack)
    no_cache = Oracle(hf, tok, pack, prefix_cache=False)
    worst_p = worst_lp = 0.0
    for i, (row, rec) in enumerate(zip(rows, records)):
        assert rec.id == row["id"]
        want = (no_cache if i < N_NO_CACHE else oracle).score(row)
        for qid, lps in want.items():
            probs = probabilities(lps)
            got = rec.scores[qid]
            assert got.answer == max(probs, key=probs.get) or abs(max(probs.values()) - got.choices[got.answer].probability) < 2e-4
            for label, lp in lps.items():
                worst_lp = max(worst_lp, abs(got.choices[label].logprob - lp))
                worst_p = max(worst_p, abs(got.choices[label].probability - probs[label]))
    print(f"{model} {pack_name}: max |dp| {worst_p:.2e}, max |dlogprob| {worst_lp:.2e}")
    assert worst_p <= 2e-4
    assert worst_lp <= 1e-3


ISSUE_6_PACK = """
name: issue6
version: "1.0.0"
description: the fault report's pack
preamble: "Classify the SMS below. Reference number 12"
prompt: "{text}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
questions:
  - id: spam
    text: Is this spam?
  - id: urgent
    text: Is this urgent?
"""


def test_a_budget_that_splits_a_messages_branches_keeps_its_digest_on_a_real_model(real, tmp_path):
    """Issue 6, fault 1, as reported: SmolLM2, budgets 16384 / 64 / 16 gave different digests."""
    decoder, tok, hf = real("smollm2-135m")
    path = tmp_path / "issue6.yaml"
    path.write_text(ISSUE_6_PACK)
    pack = load_pack(path)
    msg = Message(id="p1", fields={"id": "p1", "text": " Hello, lunch tomorrow?"})
    whole = Engine(decoder, tok, pack, "smollm2-135m", token_budget=16384).score([msg])[0]
    for budget in (64, 16):
        assert Engine(decoder, tok, pack, "smollm2-135m", token_budget=budget).score([msg])[0].digest == whole.digest
    want = Oracle(hf, tok, pack, prefix_cache=False).score(dict(msg.fields))
    for qid, lps in want.items():
        for label, lp in lps.items():
            assert whole.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4)
