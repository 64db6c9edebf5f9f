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


def _wrong(records) -> dict:
    got = {rec.id: rec.scores["spam"] for rec in records}
    return {k: (s.answer, round(s.choices["yes"].calibrated, 3)) for k, s in got.items() if s.answer != SPAM[k]}


@pytest.mark.real_model
def test_demo_examples_are_answered_as_a_person_would_by_default_and_with_the_recall_variant():
    """make demo scores with the pack's default (accuracy) calibration: every example gets a
    person's answer, the most probable calibrated one. spam's recall95 variant answers them the
    same way and each record states the threshold rule that decided it."""
    rows = [orjson.loads(x) for x in (REPO / "examples" / "messages.jsonl").read_bytes().splitlines()]
    assert {r["id"] for r in rows} == set(SPAM)
    makefile = (REPO / "Makefile").read_text()
    assert "--calibration $(CALIBRATION)" in makefile and "CALIBRATION ?= auto\n" in makefile
    messages = [Message(r["id"], r) for r in rows]
    default = Engine.load(DEFAULT_MODEL, "spam")
    assert default.calibration is not None and default.calibration.target == "accuracy"
    plain = default.score(messages)
    assert not _wrong(plain), f"answered differently from a person (answer, calibrated p(yes)): {_wrong(plain)}"
    for rec in plain:
        s = rec.scores["spam"]
        assert s.threshold is None and s.rule is None
        assert s.answer == max(s.choices, key=lambda c: s.choices[c].calibrated)
    recall = Engine.load(DEFAULT_MODEL, "spam", calibration="recall95").score(messages)
    assert not _wrong(recall), f"recall95 answered differently from a person: {_wrong(recall)}"
    for rec in recall:
        s = rec.scores["spam"]
        assert s.answer == ("yes" if s.choices["yes"].calibrated >= s.threshold else "no")
        assert s.rule is not None and s.rule.startswith(f"yes if calibrated[yes] >= {s.threshold:.3f} (recall=0.95 on spam@")
