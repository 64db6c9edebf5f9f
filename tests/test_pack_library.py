"""The shipped pack library: every pack with labelled data has a calibration and a cross-validated
report per shipped model, made for the pack file as it is (every extraction question measured on
100 rows or more), and the default model's meet the bar."""

from __future__ import annotations

import importlib.util

import orjson
import pytest
from conftest import REPO

from spinf_stream import calibration as cal
from spinf_stream.packs import load_pack

MODELS = ("qwen2.5-coder-0.5b", "gemma-3-270m", "smollm2-135m")
PACKS = sorted(p.parent.name for p in (REPO / "packs").glob("*/data.yaml"))


def _pack_table():
    spec = importlib.util.spec_from_file_location("pack_table", REPO / "bench" / "pack_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_library_holds_the_packs_of_the_issue():
    assert set(PACKS) >= {"spam", "sentiment", "news_topics", "moderation", "emotion", "irony", "clickbait",
                          "product_category", "claims"}
    assert len(load_pack("moderation").expand()) >= 90


@pytest.mark.parametrize("pack", PACKS)
@pytest.mark.parametrize("model", MODELS)
def test_each_pack_ships_a_calibration_for_its_file_and_a_report_of_it(pack, model):
    path = REPO / "packs" / pack / "calibrations" / f"{model}.json"
    c = cal.load(path)
    assert c.pack == cal.pack_identity(load_pack(pack)), f"{path} was fitted for another version of packs/{pack}.yaml"
    assert c.model.name == model
    c.bind(load_pack(pack).expand())
    doc = orjson.loads((REPO / "packs" / pack / "reports" / f"{model}.json").read_bytes())
    assert doc["calibration"] == c.id and doc["model"] == model
    extractions = doc.get("extractions", {})
    decided = {qid for qid, e in extractions.items() if "none_decision" in e}
    assert set(doc["questions"]) | decided == set(c.questions) or c.method == "contextual"
    labelled = {q.id for q in load_pack(pack).expand() if q.extract is not None and q.extract.kind != "generate"}
    assert set(extractions) == labelled, f"{pack}: the report measures no extraction of {sorted(labelled - set(extractions))}"
    assert all(e["n"] >= 100 for e in extractions.values())


@pytest.mark.real_model
@pytest.mark.parametrize("model", MODELS)
def test_shipped_calibrations_name_the_weights_of_the_shipped_models(model):
    from spinf_stream.models.resolve import resolve

    want = cal.model_identity(resolve(model))
    for pack in PACKS:
        assert cal.load(REPO / "packs" / pack / "calibrations" / f"{model}.json").model == want


#: packs whose default-model numbers are known to miss the bar (issue 9 stays open for them):
#: irony is at chance for every shipped model (the default's AUC 0.49-0.59 over ten wordings on
#: 400 held-out rows), so no map of its answers beats the class prior's log loss.
#: Strict: meeting the bar turns this into a failure to remove.
BELOW_THE_BAR = {"irony"}


@pytest.mark.parametrize(
    "pack",
    [pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="known miss, see BELOW_THE_BAR")) if p in BELOW_THE_BAR else p
     for p in PACKS],
)
def test_the_default_models_cross_validated_numbers_meet_the_bar(pack):
    doc = orjson.loads((REPO / "packs" / pack / "reports" / f"{MODELS[0]}.json").read_bytes())
    assert _pack_table().quality_bar(doc) == []
