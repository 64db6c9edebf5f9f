"""The human view of results: ``score --format table`` and its summary, checked against the
records written beside it (rich's terminal capture)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections import Counter

import orjson
import pytest
from conftest import REPO
from rich.console import Console

from spinf_stream import calibration as cal
from spinf_stream.cli.offline import score_file
from spinf_stream.engine import Engine
from spinf_stream.packs import load_pack
from spinf_stream.table import ResultsView

EXAMPLES = REPO / "examples" / "messages.jsonl"


@pytest.fixture(scope="module")
def tiny_spam_engine(tiny_models, loaded):
    decoder, tok = loaded(tiny_models("llama"))
    pack = load_pack("spam")
    q = cal.QuestionCalibration(choices=("yes", "no"), scale=(1.0, 1.0), bias=(0.0, 0.0), threshold=0.5)
    c = cal.build(pack, cal.ModelIdentity(name="tiny", weights_sha256="a" * 64), "vector", "accuracy", {"spam": q})
    return Engine(decoder, tok, pack, "tiny", calibration=c)


def test_the_table_shows_each_message_its_text_and_the_answer_with_its_probability(tiny_spam_engine, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(EXAMPLES.read_bytes() + b"not json\n")
    out = tmp_path / "out.jsonl"
    view = ResultsView(["spam"])
    score_file(tiny_spam_engine, str(src), str(out), view=view)
    console = Console(record=True, width=200, force_terminal=False)
    view.print(console, seconds=2.0)
    shown = console.export_text()
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    texts = {r["id"]: r["text"] for r in map(orjson.loads, EXAMPLES.read_bytes().splitlines())}
    lines = shown.splitlines()
    for r in records:
        if "error" in r:
            assert r["id"] == "in.jsonl:13"
            row = next(x for x in lines if "in.jsonl:13" in x)
            assert "error: invalid_json" in row
            continue
        s = r["scores"]["spam"]
        row = next(x for x in lines if f" {r['id']} " in x)
        assert " ".join(texts[r["id"]].split())[:30] in row
        assert f"{s['answer']} {s['choices'][s['answer']]['calibrated']:.2f} (yes if ≥0.50)" in row
    counts = Counter(r["scores"]["spam"]["answer"] for r in records if "scores" in r)
    assert f"spam: {' / '.join(f'{n} {a}' for a, n in counts.most_common())}" in shown
    assert "errors: 1 (1 invalid_json)" in shown
    assert "12 messages in 2.0 s: 6.0 messages/s, 6.0 questions/s" in shown


def test_a_pack_of_many_questions_shows_one_answers_column(tmp_path):
    view = ResultsView([f"q{i}" for i in range(8)])
    scores = {f"q{i}": {"answer": "no", "choices": {"yes": {"probability": 0.25}, "no": {"probability": 0.75}}} for i in range(8)}
    scores["q7"] = {"kind": "money", "answer": "£250", "value": 250.0, "probability": 0.89, "none_probability": 0.01}
    view.add({"id": "m1", "scores": scores}, "Pay £250 now")
    console = Console(record=True, width=400)
    view.print(console)
    shown = console.export_text()
    assert "answers" in shown and "q0: no 0.75" in shown and "q7: £250 0.89" in shown
    assert "q7: 1 value" in shown


def _score(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "spinf_stream.cli", "score", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_score_format_table_writes_the_records_to_the_file_and_the_table_to_stdout(tiny_models, tmp_path):
    model = tiny_models("llama")
    out = tmp_path / "out.jsonl"
    r = _score("--pack", "spam", "--model", str(model), "--input", str(EXAMPLES), "--format", "table", "--output", str(out),
               "--device", "cpu", "--no-progress")
    assert r.returncode == 0, r.stderr
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(records) == 12
    assert all(rec["id"] in r.stdout for rec in records) and "spam: " in r.stdout
    # without --output and with stdout not a terminal: the records on stdout, the summary on stderr
    plain = _score("--pack", "spam", "--model", str(model), "--input", str(EXAMPLES), "--device", "cpu", "--no-progress")
    assert plain.returncode == 0, plain.stderr
    digests = [orjson.loads(x)["digest"] for x in plain.stdout.splitlines()]
    if digests != [rec["digest"] for rec in records]:  # a cross-process difference: docs/invariance.md, "Open"
        again = _score("--pack", "spam", "--model", str(model), "--input", str(EXAMPLES), "--device", "cpu", "--no-progress")
        third = [orjson.loads(x)["digest"] for x in again.stdout.splitlines()]
        seen = (f"{[r['digest'][7:15] for r in records]} (table run), {[d[7:15] for d in digests]} (plain run), "
                f"{[d[7:15] for d in third]} (a third run); load average {os.getloadavg()}")
        if third not in (digests, [rec["digest"] for rec in records]):
            pytest.fail(f"digests differ between three processes: {seen}; stderr of the table run:\n{r.stderr}")
        # the rare cross-process outcome (docs/invariance.md, "Open"): one odd process, two alike
        warnings.warn(f"docs/invariance.md 'Open': one score process gave other digests: {seen}", stacklevel=1)
    assert "spinf-stream score: spam: " in plain.stderr
