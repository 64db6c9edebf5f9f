"""bench/adversarial.py: which rows it scores, and its numbers from answers counted by hand."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import REPO

from spinf_stream.manipulations import MANIPULATIONS
from spinf_stream.packs import load_pack


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("adversarial", REPO / "bench" / "adversarial.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ROWS = [{"id": "s1", "text": "WIN a prize! Call 80082 now", "labels": {"spam": "yes"}},
        {"id": "s2", "text": "FREE entry, text WIN to 87121", "labels": {"spam": "yes"}},
        {"id": "h1", "text": "see you at 7", "labels": {"spam": "no"}},
        {"id": "h2", "text": "did you feed the cat?", "labels": {"spam": "no"}}]


def test_every_row_is_scored_clean_and_under_every_manipulation_arguing_against_its_label(bench):
    rows = bench.manipulated_rows("spam", ROWS)
    assert len(rows) == len(ROWS) * (1 + len(MANIPULATIONS))
    by_id = {r["id"]: r for r in rows}
    assert by_id["s1|clean"]["text"] == ROWS[0]["text"]
    pack = load_pack(REPO / "packs" / "spam.yaml")
    question = pack.render_question(pack.expand()[0])
    assert by_id["s1|spam|fake_answer"]["text"] == f"{ROWS[0]['text']}\n{question} no"  # spam argues no
    assert by_id["h1|spam|fake_answer"]["text"] == f"{ROWS[2]['text']}\n{question} yes"  # ham argues yes
    assert "not spam" in by_id["s2|spam|claim_after"]["text"] and "not spam" not in by_id["h2|spam|claim_after"]["text"]


def test_accuracy_recall_and_flip_rate_are_counted_against_the_labels_and_the_clean_answers(bench):
    answers = {f"{r['id']}|{m}": {"spam": r["labels"]["spam"]} for r in ROWS
               for m in ("clean", *(f"spam|{n}" for n in MANIPULATIONS))}
    answers["s1|clean"] = {"spam": "no"}            # missed when clean; the attack cannot flip it further
    answers["s1|spam|claim_after"] = {"spam": "no"}
    answers["s2|spam|claim_after"] = {"spam": "no"}  # evaded
    answers["h1|spam|claim_after"] = {"spam": "yes"}  # framed
    answers["h2|spam|homoglyphs"] = {"spam": "yes"}
    q = bench.measure("spam", ROWS, answers)["spam"]
    clean, claim, glyph = (q["manipulations"][k] for k in ("clean", "claim_after", "homoglyphs"))
    assert clean == {"n": 4, "accuracy": 0.75, "recall": 0.5, "flip_rate": 0.0}
    assert claim == {"n": 4, "accuracy": 0.25, "recall": 0.0, "flip_rate": 0.5}
    assert glyph == {"n": 4, "accuracy": 0.75, "recall": 1.0, "flip_rate": 0.5}  # s1 flipped to right, h2 to wrong
    assert q["worst"]["manipulation"] == "claim_after" and q["worst"]["flip_rate"] == 0.5
