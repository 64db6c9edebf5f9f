"""Reads without a pack (:mod:`spinf_stream.engine.reads`): label log-probabilities after each of a
request's prompts and every prompt token's log-probability, for every family, against
transformers run on each prompt alone (fp32, eager attention)."""

from __future__ import annotations

import pytest
import torch
from oracle import greedy_writing, load_hf, next_logprobs

from spinf_stream.engine.reads import LabelRequest, label_logprobs, prompt_logprobs, prompt_trie
from tiny import FAMILIES

QUERY = "Is the following message spam? Reply yes or no.\nMessage: "
ITEMS = ["WINNER!! Claim your prize now, call 0800 123", "see you at lunch tomorrow?", "", "ok"]


@pytest.mark.parametrize("family", FAMILIES)
def test_label_logprobs_match_transformers(tiny_models, loaded, family):
    path = tiny_models(family)
    decoder, tok = loaded(path)
    model = load_hf(str(path))
    labels = tuple(tok(w, add_special_tokens=False).input_ids[0] for w in (" yes", " no", "yes"))
    prompts = tuple(tuple(tok(QUERY + item).input_ids) for item in ITEMS)
    other = LabelRequest((tuple(tok("Another request entirely").input_ids),), labels)
    got = label_logprobs(decoder, [LabelRequest(prompts, labels), other], token_budget=64)
    for ids, per_label in zip(prompts, got[0]):
        want = next_logprobs(model, list(ids))[-1]
        assert per_label == pytest.approx([float(want[t]) for t in labels], abs=1e-4)
    alone = label_logprobs(decoder, [LabelRequest(prompts, labels)], token_budget=4096)
    assert alone[0] == got[0], "a request's reads must not depend on what shares its passes"


@pytest.mark.parametrize("family", FAMILIES)
def test_prompt_logprobs_match_transformers(tiny_models, loaded, family):
    path = tiny_models(family)
    decoder, tok = loaded(path)
    model = load_hf(str(path))
    prompts = [tok(QUERY + item).input_ids for item in ITEMS] + [tok("Hello").input_ids]
    got = prompt_logprobs(decoder, prompts, top_n=5, token_budget=16)
    for ids, reads in zip(prompts, got):
        want = next_logprobs(model, ids)
        assert reads.token_logprobs[0] is None and reads.top[0] is None
        assert list(reads.token_logprobs[1:]) == pytest.approx([float(want[i - 1, ids[i]]) for i in range(1, len(ids))], abs=1e-4)
        for i in range(1, len(ids)):
            top = torch.topk(want[i - 1], 5)
            assert [t for t, _ in reads.top[i]][:2] == top.indices.tolist()[:2]
            assert [v for _, v in reads.top[i]] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [v for _, v in reads.next_top] == pytest.approx(torch.topk(want[-1], 5).values.tolist(), abs=1e-4)
        assert reads.next_token == int(torch.argmax(want[-1]))
        assert reads.next_logprob == pytest.approx(float(want[-1].max()), abs=1e-4)
    plain = prompt_logprobs(decoder, prompts, top_n=0, token_budget=16)
    assert [r.token_logprobs for r in plain] == [r.token_logprobs for r in got]
    assert all(r.top[1:] == ((),) * (len(r.tokens) - 1) and r.next_top == () for r in plain)


def test_prompt_trie_shares_prefixes():
    message, nodes = prompt_trie(0, [[1, 2, 3], [1, 2, 4], [1, 2], [5]])
    (branch,) = message.branches
    assert branch.tokens == (1, 2, 3, 4, 5)
    assert branch.parents == (-1, 0, 1, 1, -1)
    assert nodes == [[0, 1, 2], [0, 1, 3], [0, 1], [4]]
    with pytest.raises(ValueError, match="at least one token"):
        prompt_trie(0, [[1], []])


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_completions_match_transformers(tiny_models, loaded, family):
    from spinf_stream.engine.reads import CompletionSpec, complete

    path = tiny_models(family)
    decoder, tok = loaded(path)
    model = load_hf(str(path))
    prompts = [tok(QUERY + item).input_ids for item in ITEMS] + [tok("Hello").input_ids]
    n = 7
    got = complete(decoder, prompts, CompletionSpec(n, top_n=3), [tok.eos_token_id], tok.decode, token_budget=16)
    for ids, c in zip(prompts, got, strict=True):
        want, want_lps = greedy_writing(model, ids, n, tok.eos_token_id)
        assert list(c.ids) == want
        assert list(c.logprobs) == pytest.approx(want_lps, abs=1e-4)
        assert c.text == tok.decode(want) and c.finish_reason == ("length" if len(want) == n else "stop")
        for at, top in enumerate(c.top):
            lp = next_logprobs(model, ids + want[:at])[-1]
            assert top[0][0] == want[at] and [v for _, v in top] == pytest.approx(torch.topk(lp, 3).values.tolist(), abs=1e-4)
    # a request's numbers are its tree's (its prompts' shared prefix is read once): the budget
    # and the passes it is cut into change no bit of them
    assert complete(decoder, prompts, CompletionSpec(n, top_n=3), [tok.eos_token_id], tok.decode, token_budget=4096) == got


def test_a_completion_ends_at_the_first_stop_string(tiny_models, loaded):
    """The text is cut before the stop string that comes first in it, the token holding it is
    kept among the written ones, and the completion ends there with ``stop``."""
    from spinf_stream.engine.reads import CompletionSpec, complete

    decoder, tok = loaded(tiny_models("llama"))
    prompt = tok(QUERY + ITEMS[0]).input_ids
    free = complete(decoder, [prompt], CompletionSpec(8), [], tok.decode, 64)[0]
    assert free.finish_reason == "length" and len(free.ids) == 8
    text = free.text
    # a stop string beginning inside the written text: the first character of the 3rd token's text on
    at = len(tok.decode(list(free.ids[:2])))
    stop = text[at : at + 2]
    cut = complete(decoder, [prompt], CompletionSpec(8, stops=("never written", stop)), [], tok.decode, 64)[0]
    assert cut.finish_reason == "stop" and cut.text == text[: text.find(stop)]
    assert cut.ids == free.ids[: len(cut.ids)] and len(tok.decode(list(cut.ids))) >= text.find(stop) + len(stop)
    eos = complete(decoder, [prompt], CompletionSpec(8), [free.ids[3]], tok.decode, 64)[0]
    assert eos.finish_reason == "stop" and eos.ids == free.ids[: free.ids.index(free.ids[3])]
