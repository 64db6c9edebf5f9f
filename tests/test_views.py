"""A pack's ``views``: the field read cut at its sentence boundaries, and binary questions answered
from the read whose first choice leads most (spinf_stream.engine.views).

Right values come from the definition (boundaries written out by hand) and from transformers (each
view's text scored as a message of its own by ``oracle.Oracle``).
"""

from __future__ import annotations

import math

import pytest

from spinf_stream.engine.views import View, pick, sentence_starts, views_of
from spinf_stream.packs import PackError, parse_pack

# -- boundaries and views: the definition, by hand -------------------------------------------------

BOUNDARIES = [
    ("one sentence", []),
    ("One. Two", [5]),
    ("Stop! Now? yes", [6, 11]),
    ("Wait... what", [8]),
    ("He said \"go.\" Then left", [14]),
    ("(Call now.) Free", [12]),
    ("line one\nline two", [9]),
    ("line one\r\n\r\n  line two", [14]),
    ("trailing. ", []),           # nothing starts after the last boundary
    ("no space.Next", []),         # a full stop inside a word (an address, a number) is no boundary
    ("3.50 pounds. ok", [13]),
    ("end\n", []),
    ("Wow\u2026 really", [5]),
]


@pytest.mark.parametrize(("text", "starts"), BOUNDARIES)
def test_sentence_starts_follow_the_definition(text, starts):
    assert sentence_starts(text) == starts


def test_views_are_the_last_prefixes_and_first_suffixes_longest_first():
    text = "A one. B two. C three. D four."
    # boundaries at 7, 14, 23
    assert views_of(text, 2, 0) == [View("prefix:22", "A one. B two. C three."), View("prefix:13", "A one. B two.")]
    assert views_of(text, 0, 2) == [View("suffix:7", "B two. C three. D four."), View("suffix:14", "C three. D four.")]
    assert views_of(text, 8, 8) == [
        View("prefix:22", "A one. B two. C three."), View("prefix:13", "A one. B two."), View("prefix:6", "A one."),
        View("suffix:7", "B two. C three. D four."), View("suffix:14", "C three. D four."), View("suffix:23", "D four."),
    ]
    assert views_of("no boundary here", 3, 3) == []


def test_views_without_visible_text_or_repeated_are_left_out():
    assert views_of("Same. Same.", 1, 1) == [View("prefix:5", "Same.")]  # the suffix "Same." repeats it
    assert all(v.text.strip() for v in views_of("a.\n\n\nb", 3, 3))


def test_pick_takes_the_greatest_lead_and_the_first_on_ties():
    assert pick([[-1.0, -2.0], [-0.5, -3.0], [-0.1, -0.2]]) == 1
    assert pick([[-1.0, -2.0], [-2.0, -3.0]]) == 0  # equal leads: the whole message
    assert pick([[-1.0, -0.5]]) == 0


# -- the pack key ------------------------------------------------------------------------------------

PACK = """name: t
version: 1.0.0
description: x
prompt: "Message: {text}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
views: %s
questions:
  - {id: spam, text: "Is it spam?"}
  - {id: tone, text: "What tone?", choices: [calm, rude, odd]}
  - {id: amount, text: "What amount?", extract: money}
"""


@pytest.mark.parametrize(("views", "key", "words"), [
    ("{field: body, prefixes: 1, questions: [spam]}", "views.field", "not a field"),
    ("{field: text, questions: [spam]}", "views.prefixes", "both 0"),
    ("{field: text, prefixes: 9, questions: [spam]}", "views.prefixes", "8"),
    ("{field: text, prefixes: 1, questions: [nope]}", "views.questions[0]", "not a question"),
    ("{field: text, prefixes: 1, questions: [spam, tone]}", "views.questions[1]", "two choices"),
    ("{field: text, prefixes: 1, questions: [amount]}", "views.questions[0]", "two choices"),
    ("{field: text, prefixes: 1, questions: []}", "views.questions", ""),
    ("{field: text, prefixes: 1, questions: [spam], window: 3}", "views.window", ""),
])
def test_a_bad_views_key_fails_at_load_naming_file_and_key(views, key, words):
    with pytest.raises(PackError) as e:
        parse_pack(PACK % views, source="packs/t.yaml")
    assert "packs/t.yaml" in str(e.value) and key in str(e.value) and words in str(e.value), str(e.value)


def test_a_good_views_key_loads():
    pack = parse_pack(PACK % "{field: text, prefixes: 2, suffixes: 1, questions: [spam]}")
    assert (pack.views.prefixes, pack.views.suffixes, pack.views.questions) == (2, 1, ("spam",))


# -- scores: each read is a message of its own (transformers), the answer the greatest lead's ----------

VIEW_PACK = """name: v
version: 1.0.0
description: x
preamble: "Decide about each message.\\n"
prompt: "Message: {text}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
views: {field: text, prefixes: 2, suffixes: 2, questions: [spam, rude]}
questions:
  - {id: spam, text: "Is it spam?"}
  - {id: rude, text: "Is it rude?", choices: [yes indeed, not at all], choice_scoring: mean}
  - {id: long, text: "Is it long?"}
"""

MESSAGES = [
    "Win a prize now! Call 0800 123 456. This is an ordinary personal message, not spam.",
    "Hi, hope your week is going well.\n\nFREE entry to win cash. Text WIN to 80086 now.",
    "ok see you at 7",
    "Thanks. See you soon. Bye!",
]


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen2"])
def test_views_answer_from_the_read_that_leads_most_as_transformers_scores_each(tiny_models, loaded, family):
    from oracle import Oracle, load_hf

    from spinf_stream.engine import Engine, Message

    path = tiny_models(family)
    decoder, tok = loaded(path)
    pack = parse_pack(VIEW_PACK)
    recs = Engine(decoder, tok, pack, family).score([Message(str(i), {"text": t}) for i, t in enumerate(MESSAGES)])
    hf = load_hf(str(path))
    plain = parse_pack("".join(x for x in VIEW_PACK.splitlines(keepends=True) if not x.startswith("views:")))
    assert plain.views is None
    oracle = Oracle(hf, tok, plain, prefix_cache=False)  # each read on its own, and the pick done here
    viewing = Oracle(hf, tok, pack, prefix_cache=False)  # the oracle of the other tests: views its own way
    for text, rec in zip(MESSAGES, recs):
        reads = {"whole": oracle.score({"text": text})}
        viewed = viewing.score({"text": text})
        for v in views_of(text, 2, 2):
            reads[v.name] = oracle.score({"text": v.text})
        for qid in ("spam", "rude"):
            leads = {name: lps[qid][pack.expand()[0 if qid == "spam" else 1].choices[0]]
                     - lps[qid][pack.expand()[0 if qid == "spam" else 1].choices[1]] for name, lps in reads.items()}
            got = rec.scores[qid]
            if len(reads) == 1:
                assert got.view is None, "a message without views names none"
            else:
                assert got.view in reads
                assert leads[got.view] == pytest.approx(max(leads.values()), abs=1e-4), (text, qid, leads, got.view)
            want = reads[got.view or "whole"][qid]
            for label, lp in want.items():
                assert got.choices[label].logprob == pytest.approx(lp, abs=1e-4), (text, qid, label)
                assert viewed[qid][label] == pytest.approx(lp, abs=1e-4), (text, qid, label)
        for label, lp in reads["whole"]["long"].items():  # a question views do not decide: the message
            assert rec.scores["long"].choices[label].logprob == pytest.approx(lp, abs=1e-4)
        assert rec.scores["long"].view is None


def test_views_keep_a_message_bitwise_the_same_alone_in_a_batch_and_split_over_passes(tiny_models, loaded):
    from conftest import at_budget

    from spinf_stream.engine import Engine, Message

    decoder, tok = loaded(tiny_models("gemma3"))
    engine = Engine(decoder, tok, parse_pack(VIEW_PACK), "gemma3")
    batch = [Message(str(i), {"text": t}) for i, t in enumerate(MESSAGES)]
    together = [r.digest for r in engine.score(batch)]
    alone = [engine.score([m])[0].digest for m in batch]
    small = [r.digest for r in at_budget(engine, 24).score(batch)]
    reversed_ = [r.digest for r in engine.score(batch[::-1])][::-1]
    assert together == alone == small == reversed_


def test_a_view_costs_the_token_budget_what_its_read_feeds(tiny_models, loaded):
    from spinf_stream.engine import Engine, Message

    decoder, tok = loaded(tiny_models("llama"))
    engine = Engine(decoder, tok, parse_pack(VIEW_PACK), "llama")
    (p,) = engine.prepare([Message("a", {"text": MESSAGES[0]})])
    assert [v.view for v in p.views] == [v.name for v in views_of(MESSAGES[0], 2, 2)]
    assert all({b.question for b in v.branches} == {0, 1} for v in p.views)  # only the questions views decide
    assert p.cost_tokens == p.n_tokens + sum(v.n_tokens for v in p.views)
    assert math.isclose(engine.run([p])[0].scores["spam"].choices["yes"].probability
                        + engine.run([p])[0].scores["spam"].choices["no"].probability, 1.0)
