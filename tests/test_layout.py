"""Tokenization into content + branches reproduces whole-string tokenization exactly, and the
packing of messages into passes respects the token budget and the input order."""

from __future__ import annotations

import pytest

from spinf_stream.engine.layout import plan_passes
from spinf_stream.engine.segment import LayoutError, Segmenter, _build_branch
from spinf_stream.packs import load_pack

TRICKY = [
    "Free entry!! Text WIN to <PHONE> now",
    "braces {text} and {{double}} and } { stray",
    "ends with spaces   ",
    "ends with newlines\n\n\n",
    "  leading spaces and\ttabs",
    "emoji 🎉👍🏽 and CJK 中文 and accents café",
    "windows\r\nline\r\nends",
    "digits 1234567890 and 3.14159",
    "x",
]

GRID_PACK = """
name: grid
version: "1.0.0"
description: placeholders and multi-token choices
preamble: "Answer questions about messages.\\n\\nExample: hi\\nAnswer: no\\n\\n"
prompt: "Message: {text}\\n"
question: "Q: {question}\\nA:"
choices: [yes, no]
questions:
  - id: asks_{action}
    text: Does it ask to {action}?
    vars: {action: [call a number, reply, click a link]}
  - id: topic
    text: Which topic?
    choices: [World, Sports, Business, Science and technology, Sci-fi and fantasy]
"""

NO_SHARED_PREFIX_PACK = """
name: bare
version: "1.0.0"
description: question template with nothing shared between questions
prompt: "{text}"
question: "{question}"
choices: [yes, no]
questions:
  - id: a
    text: " Is it spam?"
  - id: b
    text: "\\nIs it ham?"
"""


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma-3-270m"])
def tokenizer(request):
    from transformers import AutoTokenizer

    from spinf_stream.models.resolve import resolve

    return AutoTokenizer.from_pretrained(str(resolve(request.param).path))


def _pack(tmp_path, text: str, name: str):
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return load_pack(p)


def _assert_exact(seg: Segmenter, tok, fields: dict[str, str]) -> None:
    pm = seg.prepare(0, "m", fields)
    head = seg.pack.preamble + seg.pack.render_prompt(fields)
    prefix = list(seg.preamble_ids) if pm.use_preamble else []
    for q, b in zip(seg.questions, pm.branches):
        full = head + seg.pack.render_question(q)
        want = tok(full, add_special_tokens=True)["input_ids"]
        n_branch = len(b.tokens) - (len(b.reads) - 1)  # the question's own tokens (before trie nodes)
        got = prefix + list(pm.content) + list(b.tokens[:n_branch])
        assert got == want, f"{q.id}: {full!r}"
        for label, path in zip(q.choices, b.choices):
            c_want = tok(full + seg.pack.answer_prefix + label, add_special_tokens=True)["input_ids"][len(want):]
            assert [t for _, t in path] == c_want, label


@pytest.mark.parametrize("text", TRICKY)
def test_branch_tokens_equal_whole_prompt_tokens(tokenizer, tmp_path, text):
    for pack in (load_pack("spam"), _pack(tmp_path, GRID_PACK, "grid"), _pack(tmp_path, NO_SHARED_PREFIX_PACK, "bare")):
        _assert_exact(Segmenter(tokenizer, pack, 32768), tokenizer, {"text": text})


def test_preamble_is_shared_by_real_messages(tokenizer):
    seg = Segmenter(tokenizer, load_pack("spam"), 32768)
    assert len(seg.preamble_ids) > 100
    assert seg.prepare(0, "m", {"text": "Call me back when you can"}).use_preamble


def test_multi_token_choices_share_a_trie(tokenizer, tmp_path):
    seg = Segmenter(tokenizer, _pack(tmp_path, GRID_PACK, "grid"), 32768)
    pm = seg.prepare(0, "m", {"text": "Stocks fell sharply."})
    topic = pm.branches[-1]
    firsts = [path[0][1] for path in topic.choices]
    # every choice's first token is read from the question's last token (read 0)
    assert all(path[0][0] == 0 for path in topic.choices)
    # trie nodes fed = distinct proper prefixes of the choices
    prefixes = {tuple(t for _, t in path[:i]) for path in topic.choices for i in range(1, len(path))}
    assert len(topic.reads) - 1 == len(prefixes)
    assert len(set(firsts)) <= len(firsts)


def test_build_branch_links_trie_nodes_to_their_parents():
    b = _build_branch(0, [10, 11], [[5, 6, 7], [5, 8], [9]])
    assert b.tokens == (10, 11, 5, 6)  # branch, then prefixes (5,) and (5, 6)
    assert b.parents == (-1, 0, 1, 2)
    assert b.depths == (0, 1, 2, 3)
    assert b.reads == (1, 2, 3)
    assert b.choices == (((0, 5), (1, 6), (2, 7)), ((0, 5), (1, 8)), ((0, 9),))


def test_prompt_longer_than_the_context_is_rejected(tokenizer):
    seg = Segmenter(tokenizer, load_pack("spam"), 600)
    with pytest.raises(LayoutError) as e:
        seg.prepare(0, "m", {"text": "word " * 1000})
    assert e.value.kind == "too_long"
    assert "600" in str(e.value)


def test_choice_that_merges_with_the_question_fails_at_load(tokenizer, tmp_path):
    bad = GRID_PACK.replace('question: "Q: {question}\\nA:"', 'question: "Q: {question}\\nA: ab"').replace(
        "choices: [yes, no]", "choices: [c, d]"
    ).replace('answer_prefix: " "', "")
    pack = _pack(tmp_path, bad + 'answer_prefix: ""\n', "merge")
    with pytest.raises(LayoutError, match="merges"):
        Segmenter(tokenizer, pack, 32768)


def test_passes_respect_budget_and_order(tokenizer):
    seg = Segmenter(tokenizer, load_pack("spam"), 32768)
    msgs = [seg.prepare(i, str(i), {"text": "hello there " * (i % 7 + 1)}) for i in range(30)]
    budget = 3 * max(m.n_tokens for m in msgs)
    passes = plan_passes(msgs, budget)
    flat = [w.message.index for p in passes for w in p]
    assert flat == list(range(30))
    assert all(sum(w.n_tokens for w in p) <= budget for p in passes)
    assert len(passes) >= 10


# --------------------------------------------------------------------------- passes and their plan


def _toy_message(index: int, content: int, widths: list[int]):
    from spinf_stream.engine.segment import Branch, PreparedMessage

    branches = tuple(
        Branch(q, tuple(range(w)), tuple(range(-1, w - 1)), tuple(range(w)), (w - 1,), (((0, 1),), ((0, 2),)))
        for q, w in enumerate(widths)
    )
    return PreparedMessage(index, f"m{index}", tuple(range(content)), True, 5, branches)


def test_a_message_over_the_budget_computes_its_content_once_and_carries_it():
    big = _toy_message(0, 30, [10] * 10)  # 30 + 100 tokens: passes [C b0] [b1-b4] [b5-b8] [b9 + small]
    small = _toy_message(1, 5, [3, 3])
    passes = plan_passes([big, small], token_budget=45)
    works = [w for p in passes for w in p]
    mine = [w for w in works if w.message is big]
    assert [w.with_content for w in mine] == [True] + [False] * (len(mine) - 1)
    assert mine[0].keep_kv and not any(w.keep_kv for w in mine[1:])
    assert [w.last for w in mine] == [False] * (len(mine) - 1) + [True]
    assert sorted(b for w in mine for b in w.branches) == list(range(10))
    assert all(sum(w.n_tokens for w in p) <= 45 for p in passes)
    # the small message joins the pass of the big one's last branches
    assert any(w.message is small for w in passes[-1]) and len(passes[-1]) == 2


def test_a_pass_whose_first_branch_alone_exceeds_the_budget_still_runs():
    m = _toy_message(0, 50, [4, 4])
    passes = plan_passes([m], token_budget=16)
    assert [[w.branches for w in p] for p in passes] == [[(0,)], [(1,)]]


def test_the_pass_segments_give_every_row_exactly_its_ancestors():
    """The flat description the Triton kernel reads (segments → key ranges) against the tree
    walked from the messages' own structure."""
    from spinf_stream.kernels import TreeMask

    from spinf_stream.engine.layout import Work, build_pass
    from spinf_stream.engine.segment import Branch, PreparedMessage

    trie = Branch(0, (7, 8, 9, 10, 11), (-1, 0, 1, 2, 2), (0, 1, 2, 3, 3), (2, 3, 4), ())
    a = PreparedMessage(0, "a", (1, 2, 3), True, 4, (trie, _toy_message(9, 1, [2]).branches[0]))
    b = PreparedMessage(1, "b", (4, 5), False, 0, (_toy_message(9, 1, [3]).branches[0],))
    works = [Work(a, (1,), 0, with_content=False), Work(b, (0,), 1), Work(a, (0,), 0, with_content=False)]
    layout = build_pass(works, preamble_len=4)
    q0 = layout.query_start
    mask = TreeMask.from_segments(layout.segments, range(q0, q0 + layout.n_tokens))
    # ancestors by hand, in key space: preamble 0..3, carried content of a at 4..6 (listed once
    # per carried work: 4..6 and 7..9), pass rows from q0
    visible = []
    for row in range(layout.n_tokens):
        keys = set()
        for s, n in zip(mask.kv_start[row].tolist(), mask.kv_len[row].tolist()):
            keys.update(range(s, s + n))
        visible.append(keys)
    pre = set(range(4))
    # pass rows: [a.branch1 (2)] [b.content (2)] [b.branch0 (3)] [a.trie (5)]
    assert visible[0] == pre | {4, 5, 6} | {q0}
    assert visible[1] == pre | {4, 5, 6} | {q0, q0 + 1}
    assert visible[2] == {q0 + 2} and visible[3] == {q0 + 2, q0 + 3}  # b has no preamble
    assert visible[4] == {q0 + 2, q0 + 3, q0 + 4}
    carried2 = {7, 8, 9}
    t = q0 + 7
    assert visible[7] == pre | carried2 | {t}
    assert visible[9] == pre | carried2 | {t, t + 1, t + 2}
    assert visible[10] == pre | carried2 | {t, t + 1, t + 2, t + 3}
    assert visible[11] == pre | carried2 | {t, t + 1, t + 2, t + 4}  # a sibling, not the other leaf
    # logical positions: content after the preamble, every branch after its content
    assert layout.positions.tolist() == [7, 8, 0, 1, 2, 3, 4, 7, 8, 9, 10, 10]
    assert mask.q_pos.tolist() == layout.positions.tolist()
