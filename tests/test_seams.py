"""Seams: where each real tokenizer's output provably splits (spinf_stream/engine/seams.py), checked
against the tokenizer itself on whole strings."""

from __future__ import annotations

import json
import random

import pytest

from spinf_stream.engine.seams import find_seams

MODELS = ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma-3-270m"]

#: characters and strings that stress pre-tokenizers and BPE merges around a newline
ATOMS = [
    "a", "Q", "ing", "ly", " ", "  ", "\t", "\n", "\n", "\n\n", "\r\n", "\r", "?", "!", ".", "'s", "0", "12",
    "中", "文", "🎉", "👍🏽", "é", "e\u0301", "\u0301", "▁", "\u00a0", "\u200b", "\u180e", "\u3000",
    "<|im_end|>", "<end_of_turn>", "<bos>", "<table>", "Question:", "\\", "ß",
]


@pytest.fixture(scope="module", params=MODELS)
def tok(request):
    from transformers import AutoTokenizer

    from spinf_stream.models.resolve import resolve

    return AutoTokenizer.from_pretrained(str(resolve(request.param).path))


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ATOMS) for _ in range(rng.randint(1, n)))


@pytest.mark.parametrize("split_special_tokens", [False, True])
def test_tokens_of_strings_that_agree_past_a_seam_split_there(tok, split_special_tokens):
    """The seam lemma, on the tokenizer's whole-string output: encode(s2) = encode(s)[:j] +
    encode(s2[p:]) for every seam p of s and every s2 that agrees with s on s[:p+1]."""
    seams = find_seams(tok.backend_tokenizer)
    assert seams is not None
    rng = random.Random(6)
    checked = 0
    for _ in range(1500):
        s = _text(rng, 12)
        for p in (p for p in range(len(s)) if seams.is_seam(s, p)):
            s2 = s[: p + 1] + _text(rng, 6)
            enc = tok(s, split_special_tokens=split_special_tokens, return_offsets_mapping=True)
            j = sum(1 for a, b in enc["offset_mapping"] if b <= p and (a, b) != (0, 0) or (a, b) == (0, 0))
            want = tok(s2, split_special_tokens=split_special_tokens)["input_ids"]
            tail = tok(s2[p:], add_special_tokens=False, split_special_tokens=split_special_tokens)["input_ids"]
            assert enc["input_ids"][:j] + tail == want, (s, p, s2)
            checked += 1
    assert checked > 200  # seams were met often enough to mean something


@pytest.mark.parametrize("follower", [" ", "\t", "\n", "\r", "\u00a0", "\u200b", "\u180e", "\u3000", "\u0301", "\u2028"])
def test_no_seam_before_a_space_a_format_char_or_a_combining_mark(tok, follower):
    seams = find_seams(tok.backend_tokenizer)
    assert not seams.is_seam("a\n" + follower + "b", 2)


def test_a_seam_follows_a_newline_before_a_letter_digit_or_symbol(tok):
    seams = find_seams(tok.backend_tokenizer)
    for c in "Q1?中🎉<▁":
        assert seams.is_seam("a\n" + c, 2), c
    assert not seams.is_seam("a\nQ", 1) and not seams.is_seam("a\nQ", 3)
    assert seams.last("x\nA\nb c\nd", 9) == 8
    assert seams.last("x\nA\nb c\nd", 8) == 4


def _with(tok, **changes):
    """A copy of ``tok``'s backend with parts of its tokenizer.json replaced."""
    from tokenizers import Tokenizer

    spec = json.loads(tok.backend_tokenizer.to_str())
    for key, value in changes.items():
        if key == "added_tokens":
            for t in spec["added_tokens"]:
                t.update(value)
        else:
            spec[key] = value
    return Tokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize(
    "change",
    [
        {"normalizer": {"type": "Prepend", "prepend": "▁"}},  # Llama 2 / Mistral style
        {"normalizer": {"type": "NFKC"}},
        {"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}},
        {"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\n+"}, "behavior": "MergedWithNext", "invert": False}},
        {"added_tokens": {"lstrip": True}},
    ],
    ids=["prepend", "nfkc", "metaspace", "other_regex", "lstrip"],
)
def test_pipelines_the_argument_does_not_cover_have_no_seams(change):
    from transformers import AutoTokenizer

    from spinf_stream.models.resolve import resolve

    tok = AutoTokenizer.from_pretrained(str(resolve("smollm2-135m").path))
    assert find_seams(tok.backend_tokenizer) is not None
    assert find_seams(_with(tok, **change)) is None


def test_bpe_vocabulary_joining_a_newline_to_a_letter_blocks_that_letter():
    """Without a regex pre-tokenizer, a merge across the newline must be impossible."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    vocab = {c: i for i, c in enumerate(["a", "b", "\n", "\nb", "ab"])}
    bpe = Tokenizer(BPE(vocab=vocab, merges=[("\n", "b"), ("a", "b")]))
    seams = find_seams(bpe)
    assert seams is not None
    assert not seams.is_seam("a\nb", 2)  # "\nb" is a token: the newline merges with b
    assert seams.is_seam("a\na", 2)
    assert bpe.encode("a\nb").tokens == ["a", "\nb"]
