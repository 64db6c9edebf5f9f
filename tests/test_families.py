"""Every family's forward pass against transformers' implementation, on tiny random-weight
models whose configs switch on what makes each family different (GQA, biases, q/k norms,
sliding windows shorter than the prompt, Gemma's local/global layers and soft cap)."""

from __future__ import annotations

import pytest
from conftest import dataset
from oracle import Oracle, load_hf, probabilities

from spinf_stream.engine import Engine, Message
from spinf_stream.packs import load_pack
from tiny import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("pack_name", "data"), [("spam", "sms_spam"), ("news_topics", "ag_news")])
def test_family_forward_matches_transformers(tiny_models, loaded, family, pack_name, data):
    path = tiny_models(family)
    decoder, tok = loaded(path)
    pack = load_pack(pack_name)
    rows = dataset(data, 6)
    records = Engine(decoder, tok, pack, family).score([Message(id=r["id"], fields=r) for r in rows])
    oracle = Oracle(load_hf(str(path)), tok, pack, prefix_cache=False)
    for row, rec in zip(rows, records):
        for qid, lps in oracle.score(row).items():
            probs = probabilities(lps)
            for label, lp in lps.items():
                assert rec.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4)
                assert rec.scores[qid].choices[label].probability == pytest.approx(probs[label], abs=2e-5)


def test_sliding_window_is_shorter_than_the_prompts(tiny_models, loaded):
    """The family test above only exercises windows if prompts outgrow them."""
    decoder, tok = loaded(tiny_models("gemma3"))
    pack = load_pack("spam")
    windows = [layer.window for layer in decoder.spec.layers]
    assert None in windows and any(w is not None for w in windows)
    n = len(tok(pack.preamble)["input_ids"])
    assert n > max(w for w in windows if w is not None)
