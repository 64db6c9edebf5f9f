"""``spinf-stream evaluate`` and ``calibrate`` end to end on a tiny model: the report contract,
metrics equal to scikit-learn's on the numbers ``score`` writes, calibrated records, the
sub-pack shortcut, the logprob cache."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import jsonschema
import numpy as np
import orjson
import pytest
from conftest import REPO, dataset
from sklearn.metrics import accuracy_score, f1_score, log_loss, roc_auc_score

from spinf_stream import calibration as cal
from spinf_stream.engine import Engine, Message
from spinf_stream.cli.evaluation import sub_pack
from spinf_stream.quality import expected_calibration_error
from spinf_stream.packs import load_pack

METRICS = {"accuracy", "macro_f1", "auc", "auc_ci95", "log_loss", "brier", "ece"}


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "spinf_stream.cli", *args], cwd=REPO, capture_output=True)
    if check:
        assert r.returncode == 0, r.stderr.decode()[-3000:]
    return r


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models("llama")


PACK_YAML = """\
name: sms
version: 1.0.0
description: three yes/no questions about a text message
preamble: "Is the text message spam?\\n"
prompt: "Text message: {text}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
questions:
  - id: spam
    text: Is this text message spam?
  - id: asks_to_{action}
    text: Does the message ask the reader to {action}?
    vars: {action: [call, reply]}
"""


@pytest.fixture(scope="module")
def pack_file(tmp_path_factory):
    """A small pack of three questions (the tests fit their own calibrations of it)."""
    path = tmp_path_factory.mktemp("packs") / "sms.yaml"
    path.write_text(PACK_YAML)
    return str(path)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """60 real SMS labelled on ``spam``; the first 30 also on ``asks_to_call`` (by a rule)."""
    rows = dataset("sms_spam", 60)
    path = tmp_path_factory.mktemp("labelled") / "spam.jsonl"
    with open(path, "wb") as f:
        for i, r in enumerate(rows):
            labels = {"spam": "yes" if r["label"] == "spam" else "no"}
            if i < 30:
                labels["asks_to_call"] = "yes" if "call" in r["text"].lower() else "no"
            f.write(orjson.dumps({"id": r["id"], "text": r["text"], "labels": labels}) + b"\n")
        f.write(b'{"id": "unlabelled", "text": "no labels here"}\n')
    return path


def _scored(pack_file, model_dir, labelled, tmp_path, calibration: str = "none") -> dict[str, dict]:
    """``score``'s records of the labelled rows, by id (the independent path to the numbers)."""
    out = tmp_path / f"scores-{abs(hash(calibration))}.jsonl"
    _cli("score", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled), "--output", str(out),
         "--calibration", calibration, "--no-progress")
    return {rec["id"]: rec for rec in map(orjson.loads, out.read_bytes().splitlines())}


def _truth(labelled, qid: str) -> dict[str, int]:
    rows = [orjson.loads(x) for x in labelled.read_bytes().splitlines()]
    return {r["id"]: ("yes", "no").index(r["labels"][qid]) for r in rows if qid in r.get("labels", {})}


def _arrays(records, truth, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = list(truth)
    y = np.array([truth[i] for i in ids])
    p = np.array([[records[i]["scores"][QID]["choices"][c][field] for c in ("yes", "no")] for i in ids])
    answers = np.array([("yes", "no").index(records[i]["scores"][QID]["answer"]) for i in ids])
    return y, p, answers


QID = "spam"


def test_a_sub_pack_keeps_pack_order_and_the_cache_keys_a_question_by_its_whole_pack():
    """calibrate scores with the whole pack (a sub-pack's messages can have other attention
    shapes, so other last bits: measured on AMD EPYC); its cache must not hand a question's numbers
    from one pack to another."""
    from spinf_stream.cli.evaluation import LogprobCache

    pack = load_pack("moderation")
    some = ["hate_women", "offensive", "spam"]
    part = sub_pack(pack, some)
    assert [q.id for q in part.expand()] == ["offensive", "hate_women", "spam"]  # pack order
    q = next(q for q in pack.expand() if q.id == "spam")
    fields = {"text": "a message"}
    assert LogprobCache.key(pack, q, fields) == LogprobCache.key(load_pack("moderation"), q, fields)
    assert LogprobCache.key(pack, q, fields) != LogprobCache.key(part, q, fields)
    assert LogprobCache.key(pack, q, fields) != LogprobCache.key(pack, q, {"text": "another"})


@pytest.mark.parametrize("setting", [
    {"normalize_fields": "nfkc"},
    {"escape_in_fields": {"Question:": "question -"}},
    {"special_tokens_in_fields": "parse"},
    {"choice_scoring": "mean"},
    {"views": {"field": "text", "prefixes": 2, "questions": ["spam"]}},
    {"views": {"field": "text", "prefixes": 2, "suffixes": 1, "questions": ["spam"]}},
])
def test_the_cache_keys_a_question_by_how_its_fields_are_read_and_its_choices_scored(setting):
    """A pack that reads its fields or scores its choices another way reads other numbers for the
    same text: it must not get the cached ones (spam 1.4.0's views were once calibrated on 1.3.0's
    cached whole-message numbers)."""
    from spinf_stream.cli.evaluation import LogprobCache
    from spinf_stream.packs.pack import Pack

    base = load_pack("spam")
    d = base.model_dump(exclude_none=True) | {"normalize_fields": "none", "escape_in_fields": {}}
    d.pop("views", None)
    plain = Pack.model_validate(d)
    other = Pack.model_validate(d | setting)
    fields = {"text": "Question: a message. Answer (yes or no): yes"}
    key = [LogprobCache.key(p, next(q for q in p.expand() if q.id == "spam"), fields) for p in (plain, other)]
    assert key[0] != key[1]
    assert key[0] == LogprobCache.key(Pack.model_validate(d), plain.expand()[0], fields)  # the same pack: the same key


def test_evaluate_writes_exactly_the_report_contract(pack_file, model_dir, labelled, tmp_path):
    rep = tmp_path / "report.json"
    r = _cli("evaluate", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled), "--report", str(rep),
             "--calibration", "none", "--no-progress")
    doc = orjson.loads(rep.read_bytes())
    assert set(doc) == {"pack", "model", "calibration", "questions", "warnings"} and doc["warnings"] == []
    assert doc["pack"] == {"name": "sms", "version": "1.0.0", "sha256": hashlib.sha256(open(pack_file, "rb").read()).hexdigest()}
    assert doc["model"] == str(model_dir) and doc["calibration"] is None
    assert list(doc["questions"]) == ["spam", "asks_to_call"]
    for qid, n in (("spam", 60), ("asks_to_call", 30)):
        q = doc["questions"][qid]
        assert set(q) == {"n", "raw", "calibrated", "baseline"}
        assert q["n"] == n and q["calibrated"] is None
        assert set(q["raw"]) == METRICS
        assert set(q["baseline"]) == {"accuracy", "log_loss"}
    assert b"1 without labels skipped" in r.stderr


def test_evaluate_metrics_equal_scikit_learn_on_the_scores_that_score_writes(pack_file, model_dir, labelled, tmp_path):
    rep = tmp_path / "report.json"
    _cli("evaluate", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled), "--report", str(rep),
         "--calibration", "none", "--no-progress")
    raw = orjson.loads(rep.read_bytes())["questions"][QID]["raw"]
    truth = _truth(labelled, QID)
    y, p, answers = _arrays(_scored(pack_file, model_dir, labelled, tmp_path), truth, "probability")
    assert raw["auc"] == pytest.approx(roc_auc_score(y == 0, p[:, 0]))
    assert raw["accuracy"] == pytest.approx(accuracy_score(y, answers))
    assert raw["macro_f1"] == pytest.approx(f1_score(y, answers, average="macro"))
    assert raw["log_loss"] == pytest.approx(log_loss(y, p))
    assert raw["brier"] == pytest.approx(np.mean((p[:, 0] - (y == 0)) ** 2))
    assert raw["ece"] == pytest.approx(expected_calibration_error(y, p))


@pytest.fixture(scope="module")
def calibrated(pack_file, model_dir, labelled, tmp_path_factory):
    """``calibrate --method vector --target f1``: (CAL.json path, report, stderr)."""
    d = tmp_path_factory.mktemp("cal")
    r = _cli("calibrate", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled),
             "--output", str(d / "CAL.json"), "--method", "vector", "--target", "f1", "--no-signal", "keep", "--report", str(d / "report.json"),
             "--plots", str(d / "plots"), "--cache", str(d / "cache"), "--no-progress")
    return d / "CAL.json", orjson.loads((d / "report.json").read_bytes()), r.stderr


def test_calibrate_writes_a_calibration_of_the_labelled_questions_for_this_pack_and_model(pack_file, calibrated, model_dir):
    path, doc, _ = calibrated
    c = cal.load(path)
    assert set(c.questions) == {"spam", "asks_to_call"}
    assert c.method == "vector" and c.target == "f1"
    assert c.pack == cal.pack_identity(load_pack(pack_file))
    from spinf_stream.models.resolve import resolve

    assert c.model.weights_sha256 == resolve(str(model_dir)).weights_sha256
    assert c.fitted_on.rows == {"spam": 60, "asks_to_call": 30}
    assert doc["calibration"] == c.id
    assert c.questions["spam"].threshold is not None  # f1 chose one


def test_calibrate_reports_cross_validated_not_fitted_numbers(pack_file, calibrated, model_dir, labelled, tmp_path):
    _, doc, _ = calibrated
    truth = _truth(labelled, QID)
    y, p, _ = _arrays(_scored(pack_file, model_dir, labelled, tmp_path), truth, "logprob")
    cv = cal.cross_validate("vector", p, y, ("yes", "no"), "f1", folds=5)
    got = doc["questions"][QID]["calibrated"]
    assert got["log_loss"] == pytest.approx(log_loss(y, cv.probabilities))
    assert got["accuracy"] == pytest.approx(accuracy_score(y, cv.answers))
    fitted = cal.fit_map("vector", p, y, ("yes", "no"), "f1").apply(p)
    assert got["log_loss"] != pytest.approx(log_loss(y, fitted))


def test_calibrate_matrix_reports_its_cross_validated_numbers_and_scores_with_its_map(pack_file, model_dir, labelled, tmp_path):
    out = tmp_path / "CAL.json"
    _cli("calibrate", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled), "--output", str(out),
         "--method", "matrix", "--report", str(tmp_path / "report.json"), "--no-signal", "keep", "--cache", str(tmp_path / "cache"), "--no-progress")
    c = cal.load(out)
    assert c.method == "matrix"
    assert all(q.matrix is not None and q.scale is None for q in c.questions.values())
    truth = _truth(labelled, QID)
    y, lp, _ = _arrays(_scored(pack_file, model_dir, labelled, tmp_path), truth, "logprob")
    cv = cal.cross_validate("matrix", lp, y, ("yes", "no"), "accuracy", folds=5)
    got = orjson.loads((tmp_path / "report.json").read_bytes())["questions"][QID]["calibrated"]
    assert got["log_loss"] == pytest.approx(log_loss(y, cv.probabilities))
    # records carry softmax(W @ logprobs + b), computed here from the record's own logprobs
    recs = _scored(pack_file, model_dir, labelled, tmp_path, str(out))
    w, b = np.array(c.questions[QID].matrix), np.array(c.questions[QID].bias)
    for rec in recs.values():
        ch = rec["scores"][QID]["choices"]
        z = w @ np.array([ch["yes"]["logprob"], ch["no"]["logprob"]]) + b
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        assert [ch["yes"]["calibrated"], ch["no"]["calibrated"]] == pytest.approx(want, abs=1e-12)


def test_calibrate_matrix_without_rows_of_a_choice_says_which_question(pack_file, model_dir, tmp_path):
    path = tmp_path / "one-sided.jsonl"
    rows = dataset("sms_spam", 12)
    path.write_bytes(b"".join(orjson.dumps({"id": r["id"], "text": r["text"], "labels": {"spam": "no"}}) + b"\n" for r in rows))
    r = _cli("calibrate", "--pack", pack_file, "--model", str(model_dir), "--input", str(path), "--output",
             str(tmp_path / "CAL.json"), "--method", "matrix", "--no-progress", check=False)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "question 'spam'" in err and "choices ['yes'] have none" in err and "Traceback" not in err
    assert not (tmp_path / "CAL.json").exists()


def test_calibrate_writes_both_plots_per_question(calibrated):
    path, _, _ = calibrated
    names = sorted(x.name for x in (path.parent / "plots").iterdir())
    assert names == ["asks_to_call.histogram.png", "asks_to_call.reliability.png", "spam.histogram.png", "spam.reliability.png"]
    assert all((path.parent / "plots" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


def test_scores_with_a_calibration_carry_calibrated_probabilities_and_answers(pack_file, calibrated, model_dir, labelled, tmp_path):
    path, _, _ = calibrated
    c = cal.load(path)
    recs = _scored(pack_file, model_dir, labelled, tmp_path, str(path))
    for rec in recs.values():
        assert rec["calibration"] == c.id
        for qid, q in rec["scores"].items():
            if qid not in c.questions:
                assert all("calibrated" not in ch for ch in q["choices"].values())
                continue
            m = c.questions[qid]
            lp = [q["choices"][label]["logprob"] for label in m.choices]
            z = [s * x + b for s, x, b in zip(m.scale, lp, m.bias)]
            want = [math.exp(v) / sum(math.exp(w) for w in z) for v in z]
            assert [q["choices"][label]["calibrated"] for label in m.choices] == pytest.approx(want, rel=1e-12)
            assert q["answer"] == ("yes" if want[0] >= m.threshold else "no")


def test_calibrated_records_validate_against_the_schemas(pack_file, calibrated, model_dir, labelled, tmp_path):
    from spinf_stream.engine.results import ScoreRecord
    from spinf_stream.stream.records import Source, StreamScoreRecord

    path, _, _ = calibrated
    score_schema = orjson.loads((REPO / "schemas" / "score.schema.json").read_bytes())
    stream_schema = orjson.loads((REPO / "schemas" / "stream_score.schema.json").read_bytes())
    recs = list(_scored(pack_file, model_dir, labelled, tmp_path, str(path)).values())
    assert "calibrated" in recs[0]["scores"]["spam"]["choices"]["yes"]
    for rec in recs[:10]:
        jsonschema.validate(rec, score_schema)
        stream = StreamScoreRecord(**ScoreRecord.model_validate(rec).model_dump(),
                                   source=Source(topic="t", partition=0, offset=1, timestamp=None))
        jsonschema.validate(orjson.loads(orjson.dumps(stream.model_dump(mode="json"))), stream_schema)


def test_evaluate_with_a_calibration_measures_the_calibrated_scores(pack_file, calibrated, model_dir, labelled, tmp_path):
    path, _, _ = calibrated
    rep = tmp_path / "report.json"
    _cli("evaluate", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled), "--report", str(rep),
         "--calibration", str(path), "--no-progress")
    doc = orjson.loads(rep.read_bytes())
    assert doc["calibration"] == cal.load(path).id
    truth = _truth(labelled, QID)
    y, p, answers = _arrays(_scored(pack_file, model_dir, labelled, tmp_path, str(path)), truth, "calibrated")
    got = doc["questions"][QID]["calibrated"]
    assert got["log_loss"] == pytest.approx(log_loss(y, p))
    assert got["accuracy"] == pytest.approx(accuracy_score(y, answers))
    assert got["ece"] == pytest.approx(expected_calibration_error(y, p))


def test_evaluate_warns_when_the_calibration_was_fitted_on_these_rows(pack_file, calibrated, model_dir, labelled, tmp_path):
    """Matched by row: the calibration keeps a key of each row it was fitted on, not the text."""
    path, _, _ = calibrated
    keys = cal.load(path).fitted_on.row_keys
    rows = [orjson.loads(x) for x in labelled.read_bytes().splitlines() if x.strip()]
    assert keys is not None and len(keys) == len({r["text"] for r in rows if r.get("labels")})
    some = tmp_path / "some.jsonl"  # 5 fitted rows and 5 new ones
    fresh = [{**r, "id": r["id"] + "-new", "text": r["text"] + " (again)"} for r in rows[:5]]
    some.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows[:5] + fresh))
    rep = tmp_path / "report.json"
    r = _cli("evaluate", "--pack", pack_file, "--model", str(model_dir), "--input", str(some), "--report", str(rep),
             "--calibration", str(path), "--no-progress")
    warning = f"5 of the 10 rows were used to fit calibration {cal.load(path).id}: its calibrated numbers on them are in-sample"
    assert warning in r.stderr.decode() and warning in orjson.loads(rep.read_bytes())["warnings"][0]
    strict = _cli("evaluate", "--pack", pack_file, "--model", str(model_dir), "--input", str(some), "--report", str(rep),
                  "--calibration", str(path), "--no-progress", "--strict", check=False)
    assert strict.returncode == 2 and b"--strict: 5 of the 10 rows" in strict.stderr
    new = tmp_path / "new.jsonl"
    new.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in fresh))
    clean = _cli("evaluate", "--pack", pack_file, "--model", str(model_dir), "--input", str(new), "--report", str(rep),
                 "--calibration", str(path), "--no-progress", "--limit", "3")
    assert b"in-sample" not in clean.stderr and orjson.loads(rep.read_bytes())["warnings"] == []
    assert b"using 3 of the labelled rows" in clean.stderr
    assert orjson.loads(rep.read_bytes())["questions"][QID]["n"] == sum("spam" in r["labels"] for r in fresh[:3])


def test_a_rerun_with_the_cache_scores_nothing_and_reports_the_same(pack_file, calibrated, model_dir, labelled, tmp_path):
    path, doc, first_stderr = calibrated
    assert b"scoring 60 of 60 rows" in first_stderr
    again = tmp_path / "again.json"
    r = _cli("calibrate", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled),
             "--output", str(tmp_path / "CAL.json"), "--method", "vector", "--target", "f1", "--no-signal", "keep", "--report", str(again),
             "--cache", str(path.parent / "cache"), "--no-progress")
    assert b"scoring" not in r.stderr
    assert orjson.loads(again.read_bytes()) == doc


def test_contextual_calibration_divides_out_the_content_free_inputs_for_every_question(pack_file, model_dir, labelled, loaded, tmp_path):
    out = tmp_path / "CAL.json"
    _cli("calibrate", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled), "--output", str(out),
         "--method", "contextual", "--no-progress")
    c = cal.load(out)
    pack = load_pack(pack_file)
    assert set(c.questions) == {q.id for q in pack.expand()} and c.content_free == cal.CONTENT_FREE
    decoder, tok = loaded(model_dir)
    recs = Engine(decoder, tok, pack, "tiny").score([Message(f"cf{i}", {"text": s}) for i, s in enumerate(cal.CONTENT_FREE)])
    for q in pack.expand():
        p_cf = np.mean([[r.scores[q.id].choices[label].probability for label in q.choices] for r in recs], axis=0)
        assert c.questions[q.id].bias == pytest.approx(list(-np.log(p_cf)), rel=1e-9)
        assert c.questions[q.id].scale == (1.0, 1.0)


def test_score_refuses_a_calibration_of_another_pack_with_exit_2(calibrated, model_dir, tmp_path):
    path, _, _ = calibrated
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "1", "text": "great film"}\n')
    r = _cli("score", "--pack", "sentiment", "--model", str(model_dir), "--input", str(inp), "--output", "-",
             "--calibration", str(path), check=False)
    assert r.returncode == 2
    assert b"is for pack sms" in r.stderr and b"not sentiment" in r.stderr


def test_evaluate_refuses_labels_of_an_unknown_question_naming_the_row(pack_file, model_dir, tmp_path):
    inp = tmp_path / "bad.jsonl"
    inp.write_text('{"id": "x1", "text": "hello", "labels": {"spamm": "yes"}}\n')
    r = _cli("evaluate", "--pack", pack_file, "--model", str(model_dir), "--input", str(inp), "--report",
             str(tmp_path / "r.json"), check=False)
    assert r.returncode == 2
    assert b"line 1 (id 'x1'): labels.spamm: no question 'spamm'" in r.stderr


# ------------------------------------------------------------------------- extraction questions

EXTRACT_YAML = """\
name: sms_values
version: 1.0.0
description: what a text message asks for
preamble: "Read the text message.\\n"
prompt: "Text message: {text}\\n"
question: "Question: {question}\\nAnswer:"
questions:
  - id: spam
    text: Is this text message spam?
    choices: [yes, no]
  - id: amount
    text: What amount of money does it ask for?
    extract: money
    max_tokens: 6
  - id: who
    text: Who sent it?
    extract: text
    max_tokens: 4
  - id: count
    text: How many items?
    extract: number
    max_tokens: 5
"""

EXTRACT_TEXTS = [
    "Pay £250 now", "You won $1,000", "hi mum, home at 6", "Your parcel fee is €1.99",
    "call me back", "3 tickets for 45 dollars", "Tesco: your order is ready", "win 2 iPhones",
    "Rent is 900 pounds", "ok", "Bank alert: send USD 120", "meet at the cafe",
]


def _relabel(kind: str, s: dict, right: bool):
    """A label that the record ``s`` answers rightly (``right``) or wrongly, by the definition
    of exact match (the report must count exactly the rows made right)."""
    if not right:
        return {"text": "zz-nobody", "number": 98765.25, "money": {"value": 98765.25, "currency": "GBP"}}[kind] \
            if s["answer"] is None else None
    if s["answer"] is None:
        return None
    if s["value"] is None:  # unfinished at max_tokens: no label can be right; say so by a wrong one
        return None
    if kind == "text":
        return ["someone else", f"  {s['value'].upper()}. "]  # another case and trailing punctuation still match
    if kind == "number":
        return s["value"]
    return {"value": s["value"], "currency": s["currency"]}


def test_evaluate_counts_exact_matches_nones_and_the_ece_of_extractions_by_their_definition(model_dir, tmp_path):
    pack = tmp_path / "sms_values.yaml"
    pack.write_text(EXTRACT_YAML)
    msgs = tmp_path / "msgs.jsonl"
    msgs.write_bytes(b"".join(orjson.dumps({"id": f"m{i}", "text": t}) + b"\n" for i, t in enumerate(EXTRACT_TEXTS)))
    out = tmp_path / "scores.jsonl"
    _cli("score", "--pack", str(pack), "--model", str(model_dir), "--input", str(msgs), "--output", str(out), "--no-progress")
    records = {r["id"]: r["scores"] for r in map(orjson.loads, out.read_bytes().splitlines())}
    kinds = {"amount": "money", "who": "text", "count": "number"}
    labelled = tmp_path / "labelled.jsonl"
    truth: dict[str, list[tuple[bool, bool, float, bool]]] = {q: [] for q in kinds}  # (right, none expected, p, said none)
    with open(labelled, "wb") as f:
        for i, t in enumerate(EXTRACT_TEXTS):
            labels = {}
            for qid, kind in kinds.items():
                s = records[f"m{i}"][qid]
                want_right = (i + len(qid)) % 2 == 0
                label = _relabel(kind, s, want_right)
                right = (label is None) == (s["answer"] is None) and (label is None or s["value"] is not None)
                labels[qid] = label
                truth[qid].append((right, label is None, s["probability"], s["answer"] is None))
            f.write(orjson.dumps({"id": f"m{i}", "text": t, "labels": labels}) + b"\n")
    rep = tmp_path / "report.json"
    r = _cli("evaluate", "--pack", str(pack), "--model", str(model_dir), "--input", str(labelled), "--report", str(rep),
             "--calibration", "none", "--no-progress")
    doc = orjson.loads(rep.read_bytes())
    assert doc["questions"] == {} and list(doc["extractions"]) == ["amount", "who", "count"]
    for qid, rows in truth.items():
        got = doc["extractions"][qid]
        right = np.array([x[0] for x in rows])
        none = np.array([x[1] for x in rows])
        p = np.array([x[2] for x in rows])
        said_none = np.array([x[3] for x in rows])
        assert got["kind"] == kinds[qid] and got["n"] == len(EXTRACT_TEXTS)
        assert (got["n_none"], got["n_value"]) == (int(none.sum()), int((~none).sum()))
        assert got["exact_match"] == pytest.approx(right.mean())
        assert got["none_accuracy"] == (pytest.approx(said_none[none].mean()) if none.any() else None)
        assert got["value_exact_match"] == (pytest.approx(right[~none].mean()) if (~none).any() else None)
        ece = sum(abs(right[b].mean() - p[b].mean()) * b.sum() / len(p)
                  for m in range(15) if (b := (np.clip(np.ceil(p * 15) - 1, 0, 14) == m)).any())
        assert got["ece"] == pytest.approx(ece)
        assert got["mean_probability"] == pytest.approx(p.mean())
    assert b"extraction" in r.stderr  # the summary lists them


def test_calibrate_on_extraction_labels_only_says_it_fits_choice_questions(model_dir, tmp_path):
    pack = tmp_path / "sms_values.yaml"
    pack.write_text(EXTRACT_YAML)
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text('{"id": "a", "text": "Pay £250 now", "labels": {"amount": {"value": 250, "currency": "GBP"}}}\n')
    r = _cli("calibrate", "--pack", str(pack), "--model", str(model_dir), "--input", str(labelled),
             "--output", str(tmp_path / "CAL.json"), "--no-progress", check=False)
    assert r.returncode == 2, r.stderr.decode()
    assert b"labels no choice question and no extraction question with rows both with and without a value" in r.stderr


def test_calibrate_fits_none_decisions_and_score_answers_by_them(model_dir, tmp_path):
    """An extraction question labelled with and without values gets a none map (cross-validated
    numbers under ``none_decision``); ``score`` with it reports ``none_calibrated``, the map of the
    raw ``none_probability`` by its definition, and answers none exactly where that is the more
    probable."""
    pack = tmp_path / "sms_values.yaml"
    pack.write_text(EXTRACT_YAML)
    rows = [{"id": f"m{i}", "text": t,
             "labels": {"amount": {"value": 1.0} if any(c in t for c in "£$€") or "dollars" in t or "pounds" in t else None}}
            for i, t in enumerate(EXTRACT_TEXTS * 2)]
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    rep, out = tmp_path / "report.json", tmp_path / "CAL.json"
    _cli("calibrate", "--pack", str(pack), "--model", str(model_dir), "--input", str(labelled), "--output", str(out),
         "--report", str(rep), "--method", "platt", "--folds", "3", "--no-signal", "keep", "--no-progress")
    doc = orjson.loads(rep.read_bytes())
    decision = doc["extractions"]["amount"]["none_decision"]
    assert decision["n"] == 24 and set(decision["raw"]) == METRICS and set(decision["calibrated"]) == METRICS
    cal_doc = orjson.loads(out.read_bytes())
    m = cal_doc["questions"]["amount"]
    assert m["choices"] == ["none", "value"] and list(cal_doc["questions"]) == ["amount"]
    msgs = tmp_path / "msgs.jsonl"
    msgs.write_bytes(b"".join(orjson.dumps({"id": r["id"], "text": r["text"]}) + b"\n" for r in rows[:12]))
    scores = tmp_path / "scores.jsonl"
    _cli("score", "--pack", str(pack), "--model", str(model_dir), "--input", str(msgs), "--output", str(scores),
         "--calibration", str(out), "--no-progress")
    for rec in map(orjson.loads, scores.read_bytes().splitlines()):
        s = rec["scores"]["amount"]
        p = min(max(s["none_probability"], 1e-12), 1 - 1e-12)
        z = [m["scale"][0] * math.log(p) + m["bias"][0], m["scale"][1] * math.log(1 - p) + m["bias"][1]]
        want = 1.0 / (1.0 + math.exp(z[1] - z[0]))
        assert s["none_calibrated"] == pytest.approx(want, rel=1e-9)
        assert (s["answer"] is None) == (want >= 0.5), s
        assert "none_calibrated" not in rec["scores"]["who"]  # not labelled: no map


def _relabelled(labelled, tmp_path, name: str, label) -> "Path":
    rows = [orjson.loads(x) for x in labelled.read_bytes().splitlines()]
    out = tmp_path / f"{name}.jsonl"
    out.write_bytes(b"".join(orjson.dumps({**r, "labels": {QID: label(r)}}) + b"\n" for r in rows if r.get("labels")))
    return out


def test_calibrate_ships_the_class_prior_for_a_question_without_signal_and_the_fitted_map_otherwise(
        pack_file, model_dir, labelled, tmp_path):
    """Labels by row parity are nothing the random tiny model can know: its cross-validated AUC's
    95 % interval holds 0.5, so the map shipped gives the rows' Laplace-smoothed class frequencies to every message
    (``score`` says so) and the report marks it; labels the model's own probability ranks are
    signal, and keep the fitted map. ``--no-signal keep`` ships the fitted map anyway."""
    from spinf_stream.quality import auc, auc_interval

    records = _scored(pack_file, model_dir, labelled, tmp_path)
    truth = _truth(labelled, QID)
    y, lp, _ = _arrays(records, truth, "logprob")
    median = float(np.median(lp[:, 0] - lp[:, 1]))
    ranked = {i: "yes" if records[i]["scores"][QID]["choices"]["yes"]["logprob"]
              - records[i]["scores"][QID]["choices"]["no"]["logprob"] > median else "no" for i in truth}
    order = {i: n for n, i in enumerate(truth)}
    sets = {"labels by row parity": (_relabelled(labelled, tmp_path, "chance", lambda r: ("yes", "no")[order[r["id"]] % 2]), False),
            "the model's own ranking": (_relabelled(labelled, tmp_path, "ranked", lambda r: ranked[r["id"]]), True)}
    for name, (path, signal) in sets.items():
        rows = [orjson.loads(x) for x in path.read_bytes().splitlines()]
        yy = np.array([("yes", "no").index(r["labels"][QID]) for r in rows])
        xx = np.array([[records[r["id"]]["scores"][QID]["choices"][c]["logprob"] for c in ("yes", "no")] for r in rows])
        cv = cal.cross_validate("vector", xx, yy, ("yes", "no"), "accuracy", folds=5)
        lo, hi = auc_interval(yy, cv.probabilities)
        assert (not lo <= 0.5 <= hi) is signal, (name, lo, hi)
        out, rep = tmp_path / f"{name}.json", tmp_path / f"{name}.report.json"
        r = _cli("calibrate", "--pack", pack_file, "--model", str(model_dir), "--input", str(path), "--output", str(out),
                 "--method", "vector", "--report", str(rep), "--no-progress")
        s = orjson.loads(rep.read_bytes())["questions"][QID]["signal"]
        assert s == {"auc": pytest.approx(auc(yy, cv.probabilities)), "auc_ci95": [pytest.approx(lo), pytest.approx(hi)],
                     "present": signal, "prior_map": not signal}, name
        m = cal.load(out).questions[QID]
        n_yes = int((yy == 0).sum())
        if signal:
            assert m.scale != (0.0, 0.0) and b"no signal" not in r.stderr
            continue
        assert m.scale == (0.0, 0.0) and b"spam: no signal for" in r.stderr
        got = _scored(pack_file, model_dir, path, tmp_path, str(out))
        prior = [(n_yes + 1) / (len(yy) + 2), (len(yy) - n_yes + 1) / (len(yy) + 2)]
        for rec in got.values():
            s = rec["scores"][QID]
            assert [s["choices"][c]["calibrated"] for c in ("yes", "no")] == pytest.approx(prior, abs=1e-15)
            assert s["answer"] == ("yes", "no")[int(np.argmax(prior))]
        _cli("calibrate", "--pack", pack_file, "--model", str(model_dir), "--input", str(path), "--output", str(out),
             "--method", "vector", "--no-signal", "keep", "--no-progress")
        assert cal.load(out).questions[QID].scale != (0.0, 0.0)


def test_calibrate_labelled_only_scores_the_labelled_questions_alone_and_fits_the_same_map(pack_file, calibrated, model_dir, labelled, tmp_path):
    """--labelled-only: the rows read with the sub-pack of spam and asks_to_call (asks_to_reply left
    out), cached apart from the whole pack's numbers; a calibration of the whole pack file whose
    maps and report equal the whole-pack run's to the last bits the longest branch moves."""
    path, doc, _ = calibrated
    out, rep = tmp_path / "CAL.json", tmp_path / "report.json"
    r = _cli("calibrate", "--pack", pack_file, "--model", str(model_dir), "--input", str(labelled),
             "--output", str(out), "--method", "vector", "--target", "f1", "--no-signal", "keep", "--report", str(rep),
             "--cache", str(path.parent / "cache"), "--no-progress", "--labelled-only")
    assert b"scoring 60 of 60 rows" in r.stderr  # the whole pack's cached numbers are not these
    whole, part = cal.load(path), cal.load(out)
    assert part.pack == whole.pack == cal.pack_identity(load_pack(pack_file)) and set(part.questions) == set(whole.questions)
    for qid, m in whole.questions.items():
        assert part.questions[qid].scale == pytest.approx(m.scale, abs=1e-4)
        assert part.questions[qid].bias == pytest.approx(m.bias, abs=1e-4)
    got = orjson.loads(rep.read_bytes())
    for qid, q in doc["questions"].items():
        for k in ("log_loss", "auc", "accuracy"):
            assert got["questions"][qid]["raw"][k] == pytest.approx(q["raw"][k], abs=1e-5)
