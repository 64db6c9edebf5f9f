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


SCORING_PACK = """\
name: scoring
version: 1.0.0
description: multi-token choices read three ways
prompt: "Message: {text}\\n"
question: "Question: {question}\\nAnswer:"
choices: [money or prizes, meeting up, something else entirely]
choice_scoring: mean
questions:
  - id: summed
    text: What does the message offer?
    choice_scoring: sum
  - id: averaged
    text: What is the message about?
  - id: first
    text: What does the sender want?
    choice_scoring: first_token
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_each_choice_scoring_matches_transformers(tiny_models, loaded, family, tmp_path):
    """sum, mean (divided by the choice's token count) and first_token, against the oracle's own
    per-token logprobs of each choice in context."""
    path = tiny_models(family)
    decoder, tok = loaded(path)
    (tmp_path / "scoring.yaml").write_text(SCORING_PACK)
    pack = load_pack(tmp_path / "scoring.yaml")
    assert [q.choice_scoring for q in pack.expand()] == ["sum", "mean", "first_token"]
    rows = dataset("sms_spam", 3)
    records = Engine(decoder, tok, pack, family).score([Message(id=r["id"], fields=r) for r in rows])
    oracle = Oracle(load_hf(str(path)), tok, pack, prefix_cache=False)
    lengths = {len(tok(" " + c, add_special_tokens=False)["input_ids"]) for c in pack.expand()[0].choices}
    assert len(lengths) > 1, "the choices must have unequal token counts for the modes to differ"
    for row, rec in zip(rows, records):
        want = oracle.score(row)
        assert want["summed"] != want["averaged"]
        for qid, lps in want.items():
            probs = probabilities(lps)
            for label, lp in lps.items():
                assert rec.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4), (qid, label)
                assert rec.scores[qid].choices[label].probability == pytest.approx(probs[label], abs=2e-5)
        dumped = rec.model_dump()["scores"]
        assert "choice_scoring" not in dumped["summed"]
        assert (dumped["averaged"]["choice_scoring"], dumped["first"]["choice_scoring"]) == ("mean", "first_token")


def test_first_token_scoring_refuses_choices_that_begin_with_the_same_token(tiny_models, loaded, tmp_path, caplog):
    from spinf_stream.engine.segment import LayoutError

    decoder, tok = loaded(tiny_models("llama"))
    (tmp_path / "same.yaml").write_text(SCORING_PACK.replace("meeting up", "money back"))
    with pytest.raises(LayoutError, match="'money or prizes' and 'money back' of question 'first' begin with the same token"):
        Engine(decoder, tok, load_pack(tmp_path / "same.yaml"), "llama")
    summed = SCORING_PACK.replace("choice_scoring: mean", "choice_scoring: sum").replace("    choice_scoring: first_token\n", "")
    (tmp_path / "summed.yaml").write_text(summed)
    with caplog.at_level("WARNING"):
        Engine(decoder, tok, load_pack(tmp_path / "summed.yaml"), "llama")
    assert "3 question(s) whose choices have unequal token counts under choice_scoring sum" in caplog.text
    assert "summed ('money or prizes': 3" in caplog.text
