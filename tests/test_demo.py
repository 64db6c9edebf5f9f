"""``make demo``: with the default model and the shipped calibration, every example message gets
the answer a person would give."""

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
def test_demo_examples_are_answered_as_a_person_would_with_the_shipped_calibration():
    rows = [orjson.loads(x) for x in (REPO / "examples" / "messages.jsonl").read_bytes().splitlines()]
    assert {r["id"] for r in rows} == set(SPAM)
    engine = Engine.load(DEFAULT_MODEL, "spam")  # --calibration auto, as make demo
    assert engine.calibration is not None, "no shipped calibration of packs/spam.yaml for the default model"
    records = engine.score([Message(r["id"], r) for r in rows])
    got = {rec.id: rec.scores["spam"].answer for rec in records}
    wrong = {k: (got[k], rec.scores["spam"].choices["yes"].calibrated) for k, rec in zip(got, records) if got[k] != SPAM[k]}
    assert not wrong, f"answered differently from a person (answer, calibrated p(yes)): {wrong}"
