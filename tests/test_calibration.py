"""Calibration: per-question affine maps of choice logprobs — how each method fits, how a map
applies, how thresholds are chosen, and the file's identity checks."""

from __future__ import annotations

import logging
import math
import shutil

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold

from spinf_stream import calibration as cal
from spinf_stream.packs import load_pack, packs_dirs

REPO_PACKS = packs_dirs()[-1]


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _sample(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.array([rng.choice(len(row), p=row) for row in p])


# ------------------------------------------------------------------------------- fitting methods


def test_temperature_scaling_recovers_the_temperature_of_an_overconfident_model():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6000, 3)) * 1.5
    y = _sample(np.exp(_log_softmax(logits)), rng)  # the truth: softmax(logits)
    lp = _log_softmax(logits * 3.0)  # the model: three times too confident
    scale, bias = cal.fit_question("temperature", lp, y)
    assert scale == pytest.approx([1 / 3] * 3, rel=0.05)
    assert bias == pytest.approx([0, 0, 0])


def test_platt_scaling_recovers_the_logistic_map_of_the_log_odds():
    rng = np.random.default_rng(2)
    x = rng.normal(size=20000) * 2  # the model's log-odds of "yes"
    a, c = 0.6, -1.2
    yes = rng.random(20000) < 1 / (1 + np.exp(-(a * x + c)))
    lp = np.stack([x / 2 - 3, -x / 2 - 3], axis=1)  # any logprobs with that difference
    y = np.where(yes, 0, 1)
    scale, bias = cal.fit_question("platt", lp, y)
    assert scale[0] == scale[1] == pytest.approx(a, abs=0.05)
    assert bias[0] - bias[1] == pytest.approx(c, abs=0.08)


def test_vector_scaling_recovers_per_choice_biases():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(8000, 3)) * 2
    y = _sample(np.exp(_log_softmax(logits)), rng)
    label_bias = np.array([1.5, -0.5, 0.0])  # the model favours choice 0
    lp = _log_softmax(logits + label_bias)
    scale, bias = cal.fit_question("vector", lp, y)
    assert scale == pytest.approx([1, 1, 1], abs=0.08)
    assert bias - bias[-1] == pytest.approx(-label_bias, abs=0.12)


def _mixing_truth(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Logprobs of 3 choices and labels drawn from softmax(W @ lp + b) with a W that mixes choices
    (choice 2's evidence raises choice 0): the truth probabilities come with them."""
    lp = _log_softmax(rng.normal(size=(n, 3)) * 2)
    w = np.array([[1.2, 0.0, 0.8], [0.0, 0.7, 0.0], [0.0, 0.0, 0.5]])
    b = np.array([0.3, -0.2, 0.0])
    truth = np.exp(_log_softmax(lp @ w.T + b))
    return lp, _sample(truth, rng), truth


def test_matrix_scaling_recovers_a_map_that_mixes_choices():
    rng = np.random.default_rng(4)
    lp, y, truth = _mixing_truth(rng, 20000)
    w, b = cal.fit_question("matrix", lp, y)
    assert w.shape == (3, 3) and b.shape == (3,)
    got = cal.question_map(w, b, ("a", "b", "c"), None).apply(lp)
    assert np.abs(got - truth).mean() < 0.01 and np.abs(got - truth).max() < 0.08
    # a diagonal map cannot express the mixing: the same check fails for vector scaling
    vs, vb = cal.fit_question("vector", lp, y)
    assert np.abs(cal.question_map(vs, vb, ("a", "b", "c"), None).apply(lp) - truth).mean() > 0.03


def test_matrix_scaling_of_two_choices_is_the_logistic_regression_of_both_logprobs():
    rng = np.random.default_rng(5)
    lp = _log_softmax(rng.normal(size=(20000, 2)) * 2) - rng.random((20000, 1)) * 3  # not normalised over the two
    z = 0.9 * lp[:, 0] - 0.4 * lp[:, 1] + 0.5  # log-odds of the first choice
    y = np.where(rng.random(20000) < 1 / (1 + np.exp(-z)), 0, 1)
    w, b = cal.fit_question("matrix", lp, y)
    log_odds = (w[0] - w[1]) @ lp[:3].T + (b[0] - b[1])
    assert log_odds == pytest.approx(z[:3], abs=0.1)


def test_matrix_scaling_needs_rows_of_every_choice():
    lp = np.log(np.full((10, 3), 1 / 3))
    with pytest.raises(ValueError, match=r"choices \[2\] have none"):
        cal.fit_question("matrix", lp, np.array([0, 1] * 5))


def test_contextual_calibration_divides_out_the_mean_content_free_probabilities():
    cf = np.log(np.array([[0.8, 0.2], [0.6, 0.4]]))  # p_cf = mean = (0.7, 0.3)
    scale, bias = cal.contextual_question(cf)
    assert list(scale) == [1.0, 1.0]
    assert bias == pytest.approx([-math.log(0.7), -math.log(0.3)])
    q = cal.question_map(scale, bias, ("yes", "no"), None)
    assert q.probabilities([math.log(0.7), math.log(0.3)]) == pytest.approx([0.5, 0.5])  # Zhao et al.: p / p_cf


def test_a_fitted_method_refuses_contextual_without_content_free_logprobs():
    with pytest.raises(ValueError, match="content-free"):
        cal.fit_map("contextual", np.zeros((4, 2)), np.array([0, 1, 0, 1]), ("yes", "no"), "accuracy")


# ----------------------------------------------------------------------------------- applying


def test_calibrated_probabilities_are_the_softmax_of_the_affine_map():
    q = cal.QuestionCalibration(choices=("a", "b", "c"), scale=(0.5, 1.0, 2.0), bias=(1.0, 0.0, -1.0))
    lp = [-1.0, -2.0, -0.5]
    z = [0.5 * -1.0 + 1.0, -2.0, 2.0 * -0.5 - 1.0]
    want = [math.exp(v) / sum(math.exp(w) for w in z) for v in z]
    assert q.probabilities(lp) == pytest.approx(want, rel=1e-12)
    assert q.apply(np.array([lp]))[0] == pytest.approx(want, rel=1e-12)


def test_a_matrix_map_is_the_softmax_of_the_matrix_product():
    m = ((1.0, 0.5, 0.0), (0.0, 2.0, -1.0), (0.25, 0.0, 1.0))
    q = cal.QuestionCalibration(choices=("a", "b", "c"), matrix=m, bias=(1.0, 0.0, -1.0))
    lp = [-1.0, -2.0, -0.5]
    z = [-1.0 - 1.0 + 1.0, -4.0 + 0.5, -0.25 - 0.5 - 1.0]
    want = [math.exp(v) / sum(math.exp(w) for w in z) for v in z]
    assert q.probabilities(lp) == pytest.approx(want, rel=1e-12)
    assert q.apply(np.array([lp]))[0] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("fields", "match"),
    [({"scale": (1.0, 1.0), "matrix": ((1.0, 0.0), (0.0, 1.0))}, "either scale"),
     ({}, "either scale"),
     ({"matrix": ((1.0, 0.0),)}, "2 rows of 2"),
     ({"matrix": ((1.0, 0.0), (0.0,))}, "2 rows of 2"),
     ({"matrix": ((1.0, float("nan")), (0.0, 1.0))}, "finite"),
     ({"matrix": ((1e308, 0.0), (0.0, 1.0))}, "magnitude at most"),  # finite, but overflows the map
     ({"scale": (1.0, 2e6)}, "magnitude at most"),
     ({"matrix": ((1.0, "1.5"), (0.0, 1.0))}, "valid number"),
     ({"scale": (True, 1.0)}, "valid number")],
)
def test_a_map_has_scale_or_a_square_matrix(fields, match):
    with pytest.raises(ValueError, match=match):
        cal.QuestionCalibration(choices=("yes", "no"), bias=(0.0, 0.0), **fields)


def test_a_calibration_file_whose_method_does_not_match_its_maps_is_refused():
    m = cal.QuestionCalibration(choices=("yes", "no"), matrix=((1.0, 0.0), (0.0, 1.0)), bias=(0.0, 0.0))
    v = cal.QuestionCalibration(choices=("yes", "no"), scale=(1.0, 1.0), bias=(0.0, 0.0))
    ident = {"pack": cal.PackIdentity(name="p", version="1", sha256="0" * 64),
             "model": cal.ModelIdentity(name="m", weights_sha256="0" * 64)}
    with pytest.raises(ValueError, match="method 'vector' with a matrix"):
        cal.Calibration(method="vector", questions={"q": m}, **ident)
    with pytest.raises(ValueError, match="method 'matrix' with scale"):
        cal.Calibration(method="matrix", questions={"q": v}, **ident)
    assert cal.Calibration(method="matrix", questions={"q": m}, **ident).questions["q"].matrix


def test_matrix_scaling_names_the_choices_without_rows():
    with pytest.raises(ValueError, match=r"choices \['c'\] have none"):
        cal.fit_question("matrix", np.log(np.full((10, 3), 1 / 3)), np.array([0, 1] * 5), ("a", "b", "c"))


def test_a_threshold_decides_a_binary_answer_from_the_first_choice_probability():
    q = cal.QuestionCalibration(choices=("yes", "no"), scale=(1.0, 1.0), bias=(0.0, 0.0), threshold=0.3)
    assert q.answer([0.35, 0.65]) == 0
    assert q.answer([0.25, 0.75]) == 1
    assert list(q.answers(np.array([[0.35, 0.65], [0.25, 0.75], [0.3, 0.7]]))) == [0, 1, 0]


def test_without_a_threshold_the_answer_is_the_most_probable_choice():
    q = cal.QuestionCalibration(choices=("a", "b", "c"), scale=(1.0,) * 3, bias=(0.0,) * 3)
    assert q.answer([0.2, 0.5, 0.3]) == 1


def test_a_threshold_on_a_question_with_three_choices_is_invalid():
    with pytest.raises(ValueError, match="two choices"):
        cal.QuestionCalibration(choices=("a", "b", "c"), scale=(1.0,) * 3, bias=(0.0,) * 3, threshold=0.5)


# ---------------------------------------------------------------------------------- thresholds

P_FIRST = np.array([0.9, 0.8, 0.7, 0.4, 0.3, 0.2])
FIRST_RIGHT = np.array([True, True, False, True, False, False])
# threshold: precision, recall, F1 of "first choice" by hand
#   0.9: 1, 1/3, 0.5   0.8: 1, 2/3, 0.8   0.7: 2/3, 2/3, 0.667   0.4: 3/4, 1, 0.857   0.3: 3/5, 1, 0.75
# and the threshold returned lies halfway to the next lower probability (0.8 -> 0.75, 0.4 -> 0.35)


@pytest.mark.parametrize(
    ("target", "want"),
    [("f1", 0.35), ("precision=0.9", 0.75), ("precision=0.7", 0.35), ("recall=1", 0.35), ("recall=0.5", 0.75),
     ("accuracy", None)],
)
def test_threshold_for_a_target_matches_a_hand_computation(target, want):
    got = cal.choose_threshold(P_FIRST, FIRST_RIGHT, target)
    assert got == (None if want is None else pytest.approx(want, abs=1e-15))


def test_no_rows_probability_lies_on_a_chosen_threshold():
    rng = np.random.default_rng(0)
    p = np.round(rng.random(200), 2)  # many ties
    right = rng.random(200) < p
    for target in ("f1", "precision=0.8", "recall=0.9"):
        t = cal.choose_threshold(p, right, target)
        assert not np.any(p == t)
        # the same rows are answered "first choice" as at the candidate itself
        assert ((p >= t) == (p >= p[p >= t].min())).all()


@pytest.mark.parametrize("target", ["precision", "f2", "precision=1.5", "recall=-1", ""])
def test_a_malformed_target_is_refused_naming_the_allowed_forms(target):
    with pytest.raises(ValueError, match="accuracy, f1, precision=P or recall=R"):
        cal.parse_target(target)


# --------------------------------------------------------------------------- cross-validation


def test_cross_validated_probabilities_come_from_maps_fitted_on_the_other_folds():
    rng = np.random.default_rng(4)
    x = rng.normal(size=300)
    y = np.where(rng.random(300) < 1 / (1 + np.exp(-2 * x)), 0, 1)
    lp = np.stack([x, -x], axis=1) - 2
    got = cal.cross_validate("platt", lp, y, ("yes", "no"), "accuracy", folds=5)
    assert got is not None and got.folds == 5
    for train, test in StratifiedKFold(5, shuffle=True, random_state=0).split(lp, y):
        q = cal.fit_map("platt", lp[train], y[train], ("yes", "no"), "accuracy")
        assert got.probabilities[test] == pytest.approx(q.apply(lp[test]))
    # a map fitted on every row differs from the out-of-fold ones
    everything = cal.fit_map("platt", lp, y, ("yes", "no"), "accuracy").apply(lp)
    assert not np.allclose(everything, got.probabilities)


def test_cross_validation_is_skipped_when_a_choice_is_right_in_only_one_row():
    lp = np.zeros((10, 2))
    y = np.array([0] + [1] * 9)
    assert cal.cross_validate("platt", lp, y, ("yes", "no"), "accuracy", folds=5) is None


@pytest.mark.parametrize("method", ["platt", "vector", "temperature", "matrix"])
def test_the_prior_map_gives_every_message_the_laplace_smoothed_class_frequencies(method):
    """No signal: whatever the logprobs, ``(n_j + 1) / (n + k)``; in the method's own form (a
    zero matrix for matrix), no threshold, the answer the most frequent choice."""
    rng = np.random.default_rng(1)
    y = np.array([0] * 30 + [1] * 60 + [2] * 10)
    lp = rng.normal(-3, 2, (100, 3))
    q = cal.fit_map(method, lp, y, ("a", "b", "c"), "accuracy", prior=True)
    assert (q.matrix is not None) == (method == "matrix") and q.threshold is None
    want = np.array([31, 61, 11]) / 103
    assert q.apply(lp) == pytest.approx(np.tile(want, (100, 1)), abs=1e-15)
    assert q.probabilities(list(lp[0])) == pytest.approx(list(want), abs=1e-15)
    assert set(q.answers(q.apply(lp)).tolist()) == {1}
    # a choice no row labels keeps a finite bias
    two = cal.fit_map(method, lp[:40, :2], np.zeros(40, dtype=int), ("yes", "no"), "f1", prior=True)
    assert two.apply(lp[:1, :2])[0] == pytest.approx([41 / 42, 1 / 42]) and two.threshold is None


def test_cross_validated_prior_maps_come_from_the_other_folds_frequencies():
    y = np.array([0] * 40 + [1] * 60)
    lp = np.random.default_rng(2).normal(size=(100, 2))
    got = cal.cross_validate("vector", lp, y, ("yes", "no"), "accuracy", folds=5, prior=True)
    for train, test in StratifiedKFold(5, shuffle=True, random_state=0).split(lp, y):
        n0 = int((y[train] == 0).sum())
        assert got.probabilities[test] == pytest.approx(np.tile([(n0 + 1) / (len(train) + 2), 0], (len(test), 1))
                                                       + np.tile([0, 1 - (n0 + 1) / (len(train) + 2)], (len(test), 1)))


# ---------------------------------------------------------------------------- the file, identity

MODEL = cal.ModelIdentity(name="some-model", weights_sha256="a" * 64)
OTHER_MODEL = cal.ModelIdentity(name="some-model", weights_sha256="b" * 64)


def _spam_calibration(pack=None) -> cal.Calibration:
    pack = pack or load_pack("spam")
    q = cal.QuestionCalibration(choices=("yes", "no"), scale=(0.8, 0.8), bias=(-1.0, 0.0), threshold=None)
    return cal.build(pack, MODEL, "platt", "accuracy", {"spam": q})


def test_a_calibration_round_trips_through_its_file(tmp_path):
    c = _spam_calibration()
    path = tmp_path / "CAL.json"
    path.write_bytes(c.to_json())
    assert cal.load(path) == c
    assert c.id.startswith("spam@1") and "/platt/" in c.id


def test_a_calibration_names_the_pack_file_and_the_model_weights():
    c = _spam_calibration()
    pack = load_pack("spam")
    assert c.pack == cal.pack_identity(pack)
    assert c.pack.sha256 == __import__("hashlib").sha256(pack.source.read_bytes()).hexdigest()
    assert c.model == MODEL


def test_a_calibration_is_accepted_for_its_own_pack_and_model():
    cal.check(_spam_calibration(), cal.pack_identity(load_pack("spam")), MODEL)


def test_a_calibration_is_refused_for_another_pack_version(tmp_path):
    src = REPO_PACKS / "spam.yaml"
    text = src.read_text()
    version = load_pack("spam").version
    other = tmp_path / "spam.yaml"
    other.write_text(text.replace(f"version: {version}", "version: 9.9.9"))
    with pytest.raises(cal.CalibrationError, match=r"is for pack spam .* not spam 9\.9\.9"):
        cal.check(_spam_calibration(), cal.pack_identity(load_pack(other)), MODEL)


def test_a_calibration_is_refused_for_an_edited_pack_file_of_the_same_version(tmp_path):
    other = tmp_path / "spam.yaml"
    other.write_text((REPO_PACKS / "spam.yaml").read_text().replace("Spam means", "Spam is"))
    with pytest.raises(cal.CalibrationError, match="file sha256"):
        cal.check(_spam_calibration(), cal.pack_identity(load_pack(other)), MODEL)


def test_a_calibration_is_refused_for_another_model():
    with pytest.raises(cal.CalibrationError, match=r"is for model some-model \(weights sha256 aaaaaaaaaaaa…\), not some-model \(weights sha256 bbbb"):
        cal.check(_spam_calibration(), cal.pack_identity(load_pack("spam")), OTHER_MODEL)


def test_an_edited_calibration_file_is_refused(tmp_path):
    path = tmp_path / "CAL.json"
    path.write_bytes(_spam_calibration().to_json().replace(b"-1.0", b"-5.0"))
    with pytest.raises(cal.CalibrationError, match="does not match the file's content"):
        cal.load(path)


def test_an_unreadable_calibration_file_is_refused_naming_it(tmp_path):
    with pytest.raises(cal.CalibrationError, match="nowhere.json"):
        cal.load(tmp_path / "nowhere.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "spinf-stream.calibration/1"}')
    with pytest.raises(cal.CalibrationError, match="invalid calibration .*bad.json"):
        cal.load(bad)


def test_binding_refuses_a_question_the_pack_lacks_or_other_choices():
    c = _spam_calibration()
    with pytest.raises(cal.CalibrationError, match="question 'spam' is not in pack"):
        c.bind(load_pack("sentiment").expand())
    bad = c.model_copy(update={"questions": {"spam": cal.QuestionCalibration(choices=("no", "yes"), scale=(1, 1), bias=(0, 0))}})
    with pytest.raises(cal.CalibrationError, match="has choices"):
        bad.bind(load_pack("spam").expand())


def test_binding_leaves_uncalibrated_questions_none():
    pack = load_pack("moderation")
    maps = _spam_calibration(pack).bind(pack.expand())
    assert [q.id for q, m in zip(pack.expand(), maps) if m is not None] == ["spam"]


# ------------------------------------------------------------------------- shipped calibrations


class _Resolved:
    """A stand-in for ResolvedModel: a name and a weights hash (no weights needed here)."""

    def __init__(self, name: str, sha: str):
        self.name, self.weights_sha256 = name, sha


def _packs_dir_with_spam(tmp_path, monkeypatch):
    d = tmp_path / "packs"
    d.mkdir()
    shutil.copy(REPO_PACKS / "spam.yaml", d / "spam.yaml")
    monkeypatch.setenv("SPINF_PACKS_DIR", str(d))
    return d


def test_auto_finds_the_shipped_calibration_beside_the_pack(tmp_path, monkeypatch):
    d = _packs_dir_with_spam(tmp_path, monkeypatch)
    pack = load_pack("spam")
    c = _spam_calibration(pack)
    (d / "spam" / "calibrations").mkdir(parents=True)
    (d / "spam" / "calibrations" / "some-model.json").write_bytes(c.to_json())
    assert cal.resolve("auto", pack, _Resolved("some-model", "a" * 64)) == c
    assert cal.resolve("auto", pack, _Resolved("another-model", "a" * 64)) is None
    assert cal.resolve("none", pack, _Resolved("some-model", "a" * 64)) is None


def test_auto_skips_a_stale_shipped_calibration_with_a_warning(tmp_path, monkeypatch, caplog):
    d = _packs_dir_with_spam(tmp_path, monkeypatch)
    c = _spam_calibration(load_pack("spam"))
    (d / "spam" / "calibrations").mkdir(parents=True)
    (d / "spam" / "calibrations" / "some-model.json").write_bytes(c.to_json())
    (d / "spam.yaml").write_text((d / "spam.yaml").read_text() + "\n# edited\n")
    with caplog.at_level(logging.WARNING):
        assert cal.resolve("auto", load_pack("spam"), _Resolved("some-model", "a" * 64)) is None
    assert "not using the shipped calibration" in caplog.text


def test_an_explicit_calibration_file_for_another_model_is_an_error(tmp_path):
    path = tmp_path / "CAL.json"
    path.write_bytes(_spam_calibration().to_json())
    with pytest.raises(cal.CalibrationError, match="is for model"):
        cal.resolve(str(path), load_pack("spam"), _Resolved("x", "b" * 64))


def test_a_named_variant_resolves_to_its_folder_with_or_without_the_pack_name(tmp_path, monkeypatch):
    d = _packs_dir_with_spam(tmp_path, monkeypatch)
    pack = load_pack("spam")
    default, variant = _spam_calibration(pack), cal.build(pack, MODEL, "platt", "recall=0.95", {"spam": cal.QuestionCalibration(
        choices=("yes", "no"), scale=(0.8, 0.8), bias=(-1.0, 0.0), threshold=0.25)})
    (d / "spam" / "calibrations" / "recall95").mkdir(parents=True)
    (d / "spam" / "calibrations" / "some-model.json").write_bytes(default.to_json())
    (d / "spam" / "calibrations" / "recall95" / "some-model.json").write_bytes(variant.to_json())
    pack = load_pack("spam")
    model = _Resolved("some-model", MODEL.weights_sha256)
    assert cal.shipped_variants(pack) == ["recall95"]
    assert cal.resolve("auto", pack, model) == default
    assert cal.resolve("recall95", pack, model) == variant
    assert cal.resolve("spam-recall95", pack, model) == variant
    with pytest.raises(cal.CalibrationError, match="ships no 'recall95' calibration for model other"):
        cal.resolve("recall95", pack, _Resolved("other", MODEL.weights_sha256))
    assert cal.variant_of("recall90", pack) is None


def test_an_unknown_calibration_name_is_a_usage_error_listing_the_shipped_ones(tmp_path, monkeypatch):
    from spinf_stream.cli.preflight import check_calibration
    from spinf_stream.errors import UsageError

    d = _packs_dir_with_spam(tmp_path, monkeypatch)
    (d / "spam" / "calibrations" / "recall95").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    check_calibration("recall95", load_pack("spam"))
    with pytest.raises(UsageError, match=r"ships no calibration of that name \(shipped: auto, recall95\)"):
        check_calibration("recall90", load_pack("spam"))


def test_the_decision_rule_names_the_threshold_the_target_and_the_rows():
    pack = load_pack("spam")
    q = cal.QuestionCalibration(choices=("yes", "no"), scale=(0.8, 0.8), bias=(-1.0, 0.0), threshold=0.24221)
    c = cal.build(pack, MODEL, "platt", "recall=0.95", {"spam": q})
    assert cal.decision_rule(q, c) == f"yes if calibrated[yes] >= 0.242 (recall=0.95 on spam@{pack.version} rows)"
    assert cal.decision_rule(c.questions["spam"].model_copy(update={"threshold": None}), c) is None


@pytest.mark.parametrize("threshold", [None, 0.02, 0.98])
def test_a_record_carries_the_threshold_and_rule_that_decided_its_answer(tiny_models, loaded, threshold):
    """The answer is the argmax of `calibrated` unless a threshold decides it; then the record says so."""
    from spinf_stream.engine import Engine, Message

    decoder, tok = loaded(tiny_models("llama"))
    pack = load_pack("spam")
    q = cal.QuestionCalibration(choices=("yes", "no"), scale=(1.0, 1.0), bias=(0.0, 0.0), threshold=threshold)
    c = cal.build(pack, MODEL, "vector", "precision=0.9", {"spam": q})
    texts = ["WIN a prize! Call 0800 now", "see you at 6?", "Your account is locked, click here"]
    records = Engine(decoder, tok, pack, "llama", calibration=c).score(
        [Message(id=str(i), fields={"text": t}) for i, t in enumerate(texts)])
    for r in records:
        s = r.scores["spam"]
        yes = s.choices["yes"].calibrated
        dumped = r.model_dump()["scores"]["spam"]
        if threshold is None:
            assert s.answer == max(s.choices, key=lambda k: s.choices[k].calibrated)
            assert "threshold" not in dumped and "rule" not in dumped
        else:
            assert s.answer == ("yes" if yes >= threshold else "no")
            assert dumped["threshold"] == threshold
            assert dumped["rule"] == f"yes if calibrated[yes] >= {threshold:.3f} (precision=0.9 on spam@{pack.version} rows)"
