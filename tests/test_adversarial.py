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


def test_a_detector_s_auc_is_the_chance_a_manipulated_row_scores_above_a_clean_one(bench):
    # Mann-Whitney by its definition: over every (manipulated, clean) pair, 1 if the manipulated
    # row's probability is higher, 1/2 if equal.
    clean = {"s1": 0.1, "s2": 0.3, "h1": 0.2, "h2": 0.6}
    probability = {f"{r}|clean": {"tells": p} for r, p in clean.items()}
    for i, name in enumerate(MANIPULATIONS):
        for j, r in enumerate(clean):
            probability[f"{r}|spam|{name}"] = {"tells": round(0.05 * ((i + 3 * j) % 17), 2)}
    d = bench.detection("spam", ROWS, probability, which={"tells": "yes"})["tells"]
    assert d["choice"] == "yes" and d["clean_rows"] == 4

    def by_hand(got):
        pairs = [(g, c) for g in got for c in clean.values()]
        return sum(1.0 if g > c else 0.5 if g == c else 0.0 for g, c in pairs) / len(pairs)

    every = []
    for name in MANIPULATIONS:
        got = [probability[f"{r}|spam|{name}"]["tells"] for r in clean]
        every += got
        assert d["auc"][name] == {"n": 4, "auc": pytest.approx(by_hand(got), abs=1e-12)}
    assert d["auc"]["all"] == {"n": 4 * len(MANIPULATIONS), "auc": pytest.approx(by_hand(every), abs=1e-12)}


def test_a_manipulation_argues_for_the_far_end_of_the_choices_from_the_label(bench):
    assert bench.argued_for(["yes", "no"], "yes") == "no" and bench.argued_for(["yes", "no"], "no") == "yes"
    scale = ["true", "mostly true", "half true", "barely true", "false", "pants on fire"]
    assert [bench.argued_for(scale, c) for c in scale] == ["pants on fire"] * 3 + ["true"] * 3
    assert bench.argued_for(["a", "b", "c"], "b") == "c"  # the middle of an odd list: its last choice


SUB_PACK = """\
name: arguing
version: "1.0.0"
description: three questions, one decided by views
preamble: "Read the message and answer.\\n\\n"
prompt: "Message: {text}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
views: {field: text, prefixes: 2, suffixes: 2, questions: [spam, rude, long]}
questions:
  - id: spam
    text: Is this message spam?
  - id: rude
    text: Is this message rude?
  - id: long
    text: Is this message about a long, complicated and very detailed matter of some importance to its reader?
"""


def test_attacked_questions_scored_alone_answer_as_the_whole_pack_with_its_calibration(bench, tiny_models, loaded, tmp_path):
    """--questions attacked: the sub-pack's records against the whole pack's (the same engine code,
    so the oracle is the whole pack, which test_views checks against transformers): same answers,
    calibration and views, numbers equal to the last bits the longest branch moves."""
    from spinf_stream import calibration as cal
    from spinf_stream.engine.scoring import Engine
    from spinf_stream.messages import Message
    from spinf_stream.models.resolve import resolve
    path = tiny_models("llama")
    (tmp_path / "arguing.yaml").write_text(SUB_PACK)
    pack = load_pack(tmp_path / "arguing.yaml")
    q = cal.QuestionCalibration(choices=("yes", "no"), scale=(0.8, 1.2), bias=(-0.3, 0.0), threshold=0.4)
    calibration = cal.build(pack, cal.model_identity(resolve(str(path))), "vector", "recall=0.9", {"spam": q, "rude": q})
    file = tmp_path / "CAL.json"
    file.write_bytes(calibration.to_json())
    rows = [{"id": f"r{i}", "text": t, "labels": {}} for i, t in enumerate(
        ["WIN a prize! Call 80082 now. Offer ends today.", "see you at 7", "You idiot. I said 7, not 8! Fine."])]
    messages = [{"id": r["id"], "text": m(r["text"], t)} for r in rows for m in MANIPULATIONS.values()
                for t in [bench.Target(subject="spam", wanted="no", positive=False, question="Question: Is this message spam?\nAnswer:")]]
    part = bench.score_sub_pack(pack, ["spam", "rude"], str(path), str(file), messages)
    decoder, tok = loaded(path)
    whole = Engine(decoder, tok, pack, "tiny", 512, calibration=calibration)
    full = [r.model_dump(mode="json", exclude_none=True)
            for r in whole.run(whole.prepare([Message(id=m["id"], fields={"text": m["text"]}) for m in messages]))]
    assert len(part) == len(full) == len(messages)
    for p, f in zip(part, full):
        assert p["id"] == f["id"] and p["calibration"] == f["calibration"] == calibration.id
        assert set(p["scores"]) == {"spam", "rude"}
        for qid in ("spam", "rude"):
            ps, fs = p["scores"][qid], f["scores"][qid]
            assert ps["answer"] == fs["answer"] and ps.get("view") == fs.get("view") and ps["rule"] == fs["rule"]
            for c in ("yes", "no"):
                assert ps["choices"][c]["logprob"] == pytest.approx(fs["choices"][c]["logprob"], abs=1e-5)
                assert ps["choices"][c]["calibrated"] == pytest.approx(fs["choices"][c]["calibrated"], abs=1e-5)
    assert any(p["scores"]["spam"].get("view", "whole") != "whole" for p in part)  # views were read
