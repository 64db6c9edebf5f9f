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


#: packs whose reports predate the signal decision (``signal``): refitting them scores every
#: labelled row with the whole pack, hours of CPU for moderation's 49 questions; left for a later
#: stop (issue 19's note). Strict: a refitted one must leave this set.
NO_SIGNAL_DECISION_YET = {"moderation"}


@pytest.mark.parametrize("pack", PACKS)
@pytest.mark.parametrize("model", MODELS)
def test_a_question_without_signal_ships_the_class_prior_and_one_with_signal_its_fitted_map(pack, model):
    doc = orjson.loads((REPO / "packs" / pack / "reports" / f"{model}.json").read_bytes())
    c = cal.load(REPO / "packs" / pack / "calibrations" / f"{model}.json")
    decided = dict(doc["questions"])
    decided |= {qid: e["none_decision"] for qid, e in doc.get("extractions", {}).items() if "none_decision" in e}
    if pack in NO_SIGNAL_DECISION_YET:
        assert not any("signal" in q for q in decided.values()), f"{pack} has its signal decision: remove it from the set"
        pytest.skip(f"{pack}: its reports predate the signal decision; the test runs for it once "
                    f"`bench/calibrate_packs.py --pack {pack}` refits them and it leaves NO_SIGNAL_DECISION_YET")
    for qid, q in decided.items():
        s = q["signal"]
        lo, hi = s["auc_ci95"]
        assert s["present"] is (not lo <= 0.5 <= hi) and s["prior_map"] is (not s["present"]), (qid, s)
        m = c.questions[qid]
        weights = [x for row in m.matrix for x in row] if m.matrix is not None else list(m.scale)
        assert (set(weights) == {0.0}) is s["prior_map"], qid
        if s["prior_map"]:
            p = m.probabilities([-1.0] * len(m.choices))
            assert abs(q["calibrated"]["log_loss"] - q["baseline"]["log_loss"]) <= 0.005
            assert p == m.probabilities([-9.0] + [-0.5] * (len(m.choices) - 1))


#: packs whose default-model numbers are known to miss the bar (issue 9 stays open for them):
#: irony has a weak signal for the default model (cross-validated AUC 0.561, 95 % interval
#: [0.517, 0.607]: not "no signal") and its raw probabilities are already calibrated (ECE 0.020),
#: so no fitted map beats the raw log loss out of fold (0.6834 against 0.6825; prior 0.6905).
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


def _robustness(pack: str) -> dict:
    import yaml

    return (yaml.safe_load((REPO / "packs" / pack / "data.yaml").read_text(encoding="utf-8")) or {}).get("robustness") or {}


ATTACKED = [p for p in PACKS if _robustness(p)]


def test_the_packs_of_the_robustness_issue_are_attacked():
    assert set(ATTACKED) >= {"spam", "clickbait", "claims"}


@pytest.mark.parametrize("pack", ATTACKED)
def test_a_packs_measured_worst_flip_rate_is_within_the_bound_it_states(pack):
    """The default model's bench/adversarial.py report is of the pack file and calibration shipped
    today, and under no manipulation changes more answers than data.yaml's max_flip_rate."""
    doc = orjson.loads((REPO / "packs" / pack / "robustness" / f"{MODELS[0]}.json").read_bytes())
    shipped = cal.load(REPO / "packs" / pack / "calibrations" / f"{MODELS[0]}.json")
    assert (doc["version"], doc["calibration_id"]) == (load_pack(pack).version, shipped.id), \
        f"packs/{pack}/robustness/{MODELS[0]}.json is of another pack version or calibration: run bench/adversarial.py --pack {pack}"
    for qid, how in _robustness(pack).items():
        worst = doc["questions"][qid]["worst"]
        assert worst["flip_rate"] <= how["max_flip_rate"], \
            f"{pack} {qid}: {worst['manipulation']} flips {worst['flip_rate']:.3f} of the answers, above the stated {how['max_flip_rate']}"


def test_packs_readme_holds_the_robustness_tables_the_reports_make():
    reports = sorted(REPO.glob("packs/*/robustness/*.json"))
    readme = (REPO / "packs" / "README.md").read_text(encoding="utf-8").splitlines()
    table = _pack_table()
    missing = [r for r in table.robustness_rows(reports) + table.flip_rows(reports) if r not in readme]
    assert not missing, "run bench/pack_table.py and put its robustness tables in packs/README.md: " + missing[0]
