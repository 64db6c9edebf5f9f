"""The attack catalogue: deterministic rewrites that keep the message a person reads and argue for
the wanted answer (spinf_stream/manipulations.py)."""

from __future__ import annotations

import unicodedata

import pytest

from spinf_stream.manipulations import (BENIGN, HOMOGLYPHS, MANIPULATIONS, ZERO_WIDTH_SPACE, Target,
                                        homoglyphs, zero_width)
from spinf_stream.packs import load_pack
from tests.conftest import REPO

SPAM = load_pack(REPO / "packs" / "spam.yaml")
QUESTION = SPAM.render_question(SPAM.expand()[0])
EVADE = Target(subject="spam", wanted="no", positive=False, question=QUESTION)
FRAME = Target(subject="spam", wanted="yes", positive=True, question=QUESTION)
TEXTS = ["WINNER!! You have won a £900 prize. To claim call 09061701461 now",
         "ok see you at 7, I'll book the table",
         "Ü predict wat time ü'll finish buying?",
         ""]


def test_the_catalogue_has_every_kind_the_issue_names():
    assert set(MANIPULATIONS) == {"claim_after", "claim_before", "note_to_filter", "instruction", "fake_answer",
                                  "fake_header", "quoted_label", "homoglyphs", "zero_width", "benign_padding"}


@pytest.mark.parametrize("name", sorted(MANIPULATIONS))
@pytest.mark.parametrize("text", TEXTS)
def test_a_manipulation_is_a_function_of_the_row_alone(name, text):
    f = MANIPULATIONS[name]
    assert f(text, EVADE) == f(text, EVADE) == f("".join(text), Target(**EVADE.__dict__))
    assert (f(text, EVADE) == text) == (text == "" and name in ("homoglyphs", "zero_width"))


@pytest.mark.parametrize("name", ["claim_after", "claim_before", "note_to_filter", "instruction",
                                  "fake_answer", "fake_header", "quoted_label"])
@pytest.mark.parametrize("text", TEXTS)
def test_the_text_kept_whole_and_the_argument_points_at_the_wanted_answer(name, text):
    f = MANIPULATIONS[name]
    evade, frame = f(text, EVADE), f(text, FRAME)
    assert text in evade and text in frame
    added_e, added_f = evade.replace(text, "", 1), frame.replace(text, "", 1)
    assert "spam" in added_e and "spam" in added_f
    assert ("not spam" in added_e or "no" in added_e.split()) and "not spam" not in added_f
    if name == "fake_answer":  # the pack's own question, answered as the author wants
        assert evade.endswith(f"\n{QUESTION} no") and frame.endswith(f"\n{QUESTION} yes")


@pytest.mark.parametrize("text", TEXTS)
def test_benign_padding_puts_an_everyday_paragraph_before_the_whole_message(text):
    out = MANIPULATIONS["benign_padding"](text, EVADE)
    assert out == f"{BENIGN}\n\n{text}" and "spam" not in BENIGN


def test_homoglyphs_draw_the_same_words_with_other_code_points():
    text = TEXTS[0]
    out = homoglyphs(text, EVADE)
    back = out.translate({ord(v): k for k, v in HOMOGLYPHS.items()})
    assert back == text and out != text and len(out) == len(text)
    assert "WINNER" not in out and "prize" not in out and "claim" not in out  # every long word is hidden
    assert "won" in out and "£900" in out  # short words and numbers are left as they are
    assert all(unicodedata.name(c).startswith("CYRILLIC") for c, o in zip(out, text) if c != o)


def test_zero_width_hides_every_long_word_and_removing_it_gives_the_text_back():
    text = TEXTS[0]
    out = zero_width(text, EVADE)
    assert out.replace(ZERO_WIDTH_SPACE, "") == text
    assert out.count(ZERO_WIDTH_SPACE) == 5  # WINNER, have, prize, claim, call: 4+ letters
    assert "prize" not in out and "won" in out
