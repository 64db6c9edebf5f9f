"""Every question's tokens are those of its own whole prompt (issue 6, part 2).

The right value is always the tokenizer's output on the whole prompt string
(``preamble + prompt(m) + question(q)``, then ``+ answer_prefix + label`` for a choice), computed by
``oracle.prompt_tokens`` with transformers' own tokenizer API: never our own output. Checked for
the three real tokenizers (SmolLM2 and Qwen2.5: byte-level BPE with two different pre-tokenizer
patterns; Gemma 3: sentencepiece-style BPE over whole lines), in both ``special_tokens_in_fields``
modes, and with the seams switched off (every prompt tokenized whole) as well as on.
"""

from __future__ import annotations

import json
import random

import pytest
from oracle import prompt_pieces, prompt_tokens

from spinf_stream.packs import load_pack, parse_pack
from spinf_stream.engine.segment import LayoutError, Segmenter
from spinf_stream.engine.tokenizer import PromptTokenizer

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma-3-270m"]

#: name -> (prompt, question, answer_prefix, choices, question texts): seams that merge
SEAM_PACKS = {
    # the issue's input: a word runs across the prompt/question seam and past the shared chars
    "issue": ("{text}", "{question}?", "", [" yes", " no"], ["ingly rude", "ingly kind", "ingless"]),
    "mid_word": ("{text}", "{question}", " ", ["yes", "no"], ["s", "ing", "ed up", "n't", "'s", "ly"]),
    "punctuation": ("{text}", "{question}", " ", ["yes", "no"], ["?!", "...", "—", "',", ":)", "!!!", "?"]),
    "digits": ("Order {text}", "{question} ok?", " ", ["yes", "no"], ["0", "12", "345", ".5", "1,000", "7th"]),
    "multibyte": ("{text}", "{question}", " ", ["yes", "no"], ["中文吗", "é?", "🎉🎉", "👍🏽", "\u0301x", "ß", "語"]),
    "whitespace": ("{text}", "{question}", " ", ["yes", "no"], ["  x", "\t\ty", "\n\nz", "\r\nQ", " \n y", "   ?", "\n?"]),
    "newline_seam": (
        "Text: {text}\n", "Question: {question}\nAnswer:", " ", ["yes", "no"],
        ["Is it spam?", "Is it ham?", "Does it ask to call?"],
    ),
    "after_newline": (
        "{text}\n", "{question}", " ", ["yes", "no"],
        ["Q?", "1?", "?", "中?", "🎉?", "▁x?", "\u180ex?", "\u200bx?", "\u00a0x?", " x?", "\nx?", "\u0301x?", "<x>?"],
    ),
    "newline_runs": ("{text}\n\n", "{question}\nA:", " ", ["yes", "no"], ["Q1", "Q2", "\nQ3", " Q4"]),
    "multi_token_choices": (
        "{text}\n", "Q: {question}\nA:", " ", ["Science and technology", "Sci-fi and fantasy", "World"],
        ["Which topic?", "Which topic is it?"],
    ),
    "no_newline_in_question": ("Msg: {text}", " Is it {question}?", " ", ["yes", "no"], ["spam", "spammy", "ham"]),
}

MESSAGES = [
    "spam", "Hello", "ing", "ends with newline\n", "ends with spaces   ", "crlf\r\n", "12", "中文", "emoji 🎉",
    "x\n\n", "mid\nline", "a\u0301", "tab\t", "▁▁", "Free entry!! Text WIN to <PHONE> now", "café", "\n", "?",
]


@pytest.fixture(scope="module", params=MODELS)
def tok(request):
    """``(transformers tokenizer, PromptTokenizer)``: the copy is made once per module."""
    from transformers import AutoTokenizer

    from spinf_stream.models.resolve import resolve

    t = AutoTokenizer.from_pretrained(str(resolve(request.param).path))
    return t, PromptTokenizer(t)


def _yaml_pack(prompt, question, answer_prefix, choices, texts, mode="plain", preamble=""):
    q = "\n".join(f"  - {{id: q{i}, text: {json.dumps(t, ensure_ascii=False)}}}" for i, t in enumerate(texts))
    return parse_pack(
        f"name: t\nversion: '1.0.0'\ndescription: x\npreamble: {json.dumps(preamble, ensure_ascii=False)}\n"
        f"prompt: {json.dumps(prompt, ensure_ascii=False)}\nquestion: {json.dumps(question, ensure_ascii=False)}\n"
        f"answer_prefix: {json.dumps(answer_prefix, ensure_ascii=False)}\nchoices: {json.dumps(choices, ensure_ascii=False)}\n"
        f"special_tokens_in_fields: {mode}\nquestions:\n{q}\n"
    )


def check_whole_prompt_tokens(seg: Segmenter, tok, fields: dict[str, str]) -> bool:
    """Assert every question's content + branch tokens and every choice's path equal the whole
    prompt's tokenization; a message rejected for ``choice_tokenization`` must be one whose whole
    prompts really do not extend. Returns whether the message was scored."""
    mode = seg.tokenizer.mode
    head = prompt_pieces(seg.pack, fields)
    wholes = []
    for q in seg.questions:
        pieces = [*head, (seg.pack.render_question(q), False)]
        full = prompt_tokens(tok, pieces, mode)
        conts = [prompt_tokens(tok, [*pieces, (seg.pack.answer_prefix + c, False)], mode) for c in q.choices]
        wholes.append((full, conts))
    extends = all(c[: len(f)] == f and len(c) > len(f) for f, cs in wholes for c in cs)
    try:
        pm = seg.prepare(0, "m", fields)
    except LayoutError as e:
        assert e.kind == "choice_tokenization" and not extends, str(e)
        return False
    assert extends
    prefix = list(seg.preamble_ids) if pm.use_preamble else []
    for q, b, (full, conts) in zip(seg.questions, pm.branches, wholes):
        n_own = len(b.tokens) - (len(b.reads) - 1)  # the question's own tokens, before trie nodes
        assert prefix + list(pm.content) + list(b.tokens[:n_own]) == full, (q.id, fields)
        for label, path, c in zip(q.choices, b.choices, conts):
            assert [t for _, t in path] == c[len(full) :], (q.id, label, fields)
    return True


@pytest.mark.parametrize("seams", ["seams", "whole"])
@pytest.mark.parametrize("mode", ["plain", "parse"])
@pytest.mark.parametrize("pack_name", list(SEAM_PACKS))
def test_every_question_is_tokenized_as_its_whole_prompt(tok, pack_name, mode, seams):
    hf, ptok = tok
    try:
        seg = Segmenter(PromptTokenizer(ptok, mode), _yaml_pack(*SEAM_PACKS[pack_name], mode=mode), 1 << 20)
    except LayoutError:
        pytest.skip("this tokenizer merges a choice with this pack's question ending, which Segmenter refuses at load "
                    "(tested in test_layout); the case runs for the tokenizers that keep them apart")
    if seams == "whole":
        seg.tokenizer.seams = None
    scored = [check_whole_prompt_tokens(seg, hf, {"text": m}) for m in MESSAGES]
    assert sum(scored) >= len(MESSAGES) // 2


ATOMS = [
    "a", "ing", "ly", "less", " ", "\n", "\n", "\r\n", "  ", "\t", "?", "!", ".", "0", "12", "中", "文", "🎉",
    "👍🏽", "é", "e\u0301", "▁", "\u00a0", "\u200b", "'s", "'t", "\\", "Q", "x", " yes", "\n\n",
    "<|im_end|>", "<|im_start|>", "<end_of_turn>", "<start_of_turn>", "<bos>", "<table>",
]


def _random(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ATOMS) for _ in range(rng.randint(1, n)))


@pytest.mark.parametrize("seams", ["seams", "whole"])
def test_random_packs_and_messages_tokenize_as_whole_prompts(tok, seams):
    """A property test: random templates, question texts and messages built from characters that
    merge (special-token text in both the pack and the messages)."""
    hf, ptok = tok
    rng = random.Random(20260)
    scored = packs = 0
    for _ in range(120):
        texts = list(dict.fromkeys(t for t in (_random(rng, 4) for _ in range(rng.randint(1, 4))) if t.strip()))
        if not texts:
            continue
        mode = rng.choice(["plain", "parse"])
        pack = _yaml_pack(
            rng.choice(["{text}", "{text}\n", "Text: {text}\n", "{text} ", "<{text}>", "{text}\n\n", "<|im_start|>{text}<|im_end|>\n"]),
            rng.choice(["{question}", "{question}?", "Question: {question}\nAnswer:", "\n{question}", " {question}"]),
            rng.choice(["", " ", "\n"]),
            rng.choice([["yes", "no"], [" yes", " no"], ["A", "B", "C"]]),
            texts,
            mode=mode,
            preamble=rng.choice(["", "Intro.\n", "Classify:\nExample: hi\nAnswer: no\n", "<bos>sys\n"]),
        )
        try:
            seg = Segmenter(PromptTokenizer(ptok, mode), pack, 1 << 20)
        except LayoutError:
            continue
        if seams == "whole":
            seg.tokenizer.seams = None
        packs += 1
        for _ in range(4):
            scored += check_whole_prompt_tokens(seg, hf, {"text": _random(rng, 6)})
    assert packs > 60 and scored > 150


@pytest.mark.parametrize("pack_name", ["spam", "sentiment", "news_topics"])
def test_shipped_packs_tokenize_each_message_whole_only_once(tok, pack_name):
    """The seam after ``{text}\\n`` serves every question: one whole-prompt tokenization per
    message (question 0's), and each question's own tail is tokenized once per pack, not per message."""
    hf, ptok = tok
    pack = load_pack(pack_name)
    seg = Segmenter(PromptTokenizer(ptok), pack, 1 << 20)
    calls: list[tuple[str, int]] = []
    encode, with_offsets = seg.tokenizer.encode, seg.tokenizer.encode_with_offsets
    seg.tokenizer.encode = lambda prompts, **kw: calls.append(("encode", len(prompts))) or encode(prompts, **kw)
    seg.tokenizer.encode_with_offsets = lambda prompt, **kw: calls.append(("whole", 1)) or with_offsets(prompt, **kw)
    fields = {"title": "Markets rally", "text": "Stocks rose sharply.\nAnalysts cheered."}
    seg.prepare(0, "a", {f: fields[f] for f in pack.fields})
    calls.clear()
    second = {"title": "Cup final", "text": "The home side won 2-1 in extra time."}
    check_whole_prompt_tokens(seg, hf, {f: second[f] for f in pack.fields})
    assert calls == [("whole", 1)]


def test_content_is_the_longest_prefix_every_question_shares(tok):
    """Content = the tokens all whole prompts start with, leaving each question one of its own."""
    hf, ptok = tok
    for pack_name, fields in [("spam", {"text": "Call me back when you can"}), ("issue", {"text": "spam"})]:
        pack = load_pack(pack_name) if pack_name == "spam" else _yaml_pack(*SEAM_PACKS[pack_name])
        seg = Segmenter(PromptTokenizer(ptok), pack, 1 << 20)
        head = prompt_pieces(pack, fields)
        fulls = [prompt_tokens(hf, [*head, (pack.render_question(q), False)], "plain") for q in pack.expand()]
        shared = min(len(f) for f in fulls) - 1
        for f in fulls[1:]:
            shared = min(shared, next(i for i, (a, b) in enumerate(zip(fulls[0], f + [None])) if a != b))
        pm = seg.prepare(0, "m", fields)
        before = len(seg.preamble_ids) if pm.use_preamble else 0
        assert before + len(pm.content) == shared, pack_name
        assert (list(seg.preamble_ids) if pm.use_preamble else []) + list(pm.content) == fulls[0][:shared]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_issue_question_after_a_word_seam_scores_as_transformers_on_its_whole_prompt(tiny_models, loaded, family):
    """The issue's exact input: q3's prompt is "spamingless?" as one string, whatever q1 and q2 are."""
    from oracle import Oracle, load_hf

    from spinf_stream.engine import Engine, Message

    path = tiny_models(family)
    decoder, tok = loaded(path)
    pack = _yaml_pack(*SEAM_PACKS["issue"])  # q0 "ingly rude", q1 "ingly kind", q2 "ingless"
    rec = Engine(decoder, tok, pack, family).score([Message("p", {"text": "spam"})])[0]
    oracle = Oracle(load_hf(str(path)), tok, pack, prefix_cache=False)
    assert prompt_tokens(tok, [("spam", True), ("ingless?", False)], "plain") == tok("spamingless?")["input_ids"]
    for qid, lps in oracle.score({"text": "spam"}).items():
        for label, lp in lps.items():
            assert rec.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4), (qid, label)


@pytest.mark.real_model
def test_issue_input_on_real_smollm2_matches_transformers(loaded):
    from oracle import Oracle, load_hf

    from spinf_stream.engine import Engine, Message
    from spinf_stream.models.resolve import resolve

    path = resolve("smollm2-135m").path
    decoder, tok = loaded(path)
    pack = _yaml_pack(*SEAM_PACKS["issue"])
    rec = Engine(decoder, tok, pack, "smollm2-135m").score([Message("p1", {"text": "spam"})])[0]
    want = Oracle(load_hf(str(path)), tok, pack, prefix_cache=False).score({"text": "spam"})
    for qid, lps in want.items():
        for label, lp in lps.items():
            assert rec.scores[qid].choices[label].logprob == pytest.approx(lp, abs=1e-4), (qid, label)


def test_prepare_from_several_threads_gives_what_it_gives_alone(tok):
    """Engine.prepare is documented thread-safe: the segmenter's caches and the tokenizer copy
    must not mix up concurrent messages."""
    from concurrent.futures import ThreadPoolExecutor

    hf, ptok = tok
    pack = _yaml_pack(*SEAM_PACKS["newline_runs"])
    texts = [f"{m} {i}\n" * (i % 3 + 1) for i, m in enumerate(MESSAGES * 4)]
    alone = [Segmenter(PromptTokenizer(ptok), pack, 1 << 20).prepare(i, str(i), {"text": t}) for i, t in enumerate(texts)]
    seg = Segmenter(PromptTokenizer(ptok), pack, 1 << 20)
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda it: seg.prepare(it[0], str(it[0]), {"text": it[1]}), enumerate(texts)))
    assert together == alone
