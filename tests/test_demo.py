"""``make demo``: with the default model and the demo's calibration, every example message gets
the answer a person would give, and each record says how its answer was decided."""

from __future__ import annotations

import orjson
import pytest
from conftest import REPO

from spinf_stream.config import DEFAULT_MODEL
from spinf_stream.engine import Engine, Message

# A person's answer to "Is this text message spam?" for examples/messages.jsonl.
SPAM = {
    "ex-01": "no", "ex-02": "yes", "ex-03": "no", "ex-04": "yes", "ex-05": "no", "ex-06": "yes",
    "ex-07": "no", "ex-08": "no", "ex-09": "yes", "ex-10": "no", "ex-11": "yes", "ex-12": "no",
}


@pytest.mark.real_model
def test_demo_examples_are_answered_as_a_person_would_with_the_demos_calibration():
    """make demo scores with spam's recall95 calibration (a spam folder that catches scams): every
    example gets a person's answer, and each record states the threshold rule that decided it."""
    rows = [orjson.loads(x) for x in (REPO / "examples" / "messages.jsonl").read_bytes().splitlines()]
    assert {r["id"] for r in rows} == set(SPAM)
    assert "--calibration $(CALIBRATION)" in (REPO / "Makefile").read_text()
    engine = Engine.load(DEFAULT_MODEL, "spam", calibration="recall95")
    records = engine.score([Message(r["id"], r) for r in rows])
    got = {rec.id: rec.scores["spam"].answer for rec in records}
    wrong = {k: (got[k], rec.scores["spam"].choices["yes"].calibrated) for k, rec in zip(got, records) if got[k] != SPAM[k]}
    assert not wrong, f"answered differently from a person (answer, calibrated p(yes)): {wrong}"
    for rec in records:
        s = rec.scores["spam"]
        assert s.answer == ("yes" if s.choices["yes"].calibrated >= s.threshold else "no")
        assert s.rule is not None and s.rule.startswith(f"yes if calibrated[yes] >= {s.threshold:.3f} (recall=0.95 on spam@")
    # the default (accuracy) calibration: the most probable calibrated answer, no threshold; it
    # ranks every scam above every personal message
    default = Engine.load(DEFAULT_MODEL, "spam")
    assert default.calibration is not None and default.calibration.target == "accuracy"
    plain = {r.id: r.scores["spam"] for r in default.score([Message(r["id"], r) for r in rows])}
    assert all(s.threshold is None and s.answer == max(s.choices, key=lambda c: s.choices[c].calibrated) for s in plain.values())
    assert min(plain[k].choices["yes"].calibrated for k in SPAM if SPAM[k] == "yes") > \
        max(plain[k].choices["yes"].calibrated for k in SPAM if SPAM[k] == "no")
