"""``spinf-stream score``: one output line per input line, in order; bad lines get an error
record in their place; exit code 0 unless --strict (or no line could be scored)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import orjson
import pytest
from conftest import REPO

from spinf_stream.engine import Engine, Message
from spinf_stream.messages import Decoded
from spinf_stream.cli.offline import parse_line
from spinf_stream.packs import load_pack

BAD_LINES = [
    (b"\xff\xfe not utf-8", "invalid_utf8"),
    (b"not json", "invalid_json"),
    (b"[1, 2]", "not_an_object"),
    (b'{"id": "z", "body": "no text"}', "missing_field"),
    (b'{"id": "a", "text": ""}', "empty_field"),
    (b'{"id": "b", "text": "   "}', "empty_field"),
    (b'{"id": "c", "text": 42}', "wrong_type"),
    (b'{"id": "d"}', "missing_field"),
    (b'{"id": ["e"], "text": "x"}', "wrong_type"),
    (b"", "empty_value"),
]


def _run(args, **kw):
    # on the CPU in float32, like the in-process engines the records are compared with
    cpu = ["--device", "cpu", "--dtype", "float32"]
    return subprocess.run([sys.executable, "-m", "spinf_stream.cli", "score", *args, *cpu], cwd=REPO, capture_output=True, **kw)


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models("llama")


def test_bad_lines_get_error_records_in_place_and_the_rest_are_scored(model_dir, loaded, tmp_path):
    good = [orjson.loads(line) for line in (REPO / "examples" / "messages.jsonl").read_bytes().splitlines()[:5]]
    lines = []
    for i, (bad, _) in enumerate(BAD_LINES):
        lines.append(orjson.dumps(good[i % 5] | {"id": f"good-{i}"}))
        lines.append(bad)
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"
    args = ["--pack", "spam", "--input", str(inp), "--output", str(out), "--model", str(model_dir), "--no-progress"]
    r = _run(args)
    assert r.returncode == 0, r.stderr.decode()
    recs = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert len(recs) == len(lines)
    decoder, tok = loaded(model_dir)
    engine = Engine(decoder, tok, load_pack("spam"), str(model_dir))
    wants = [engine.score([Message(id=f"good-{i}", fields=good[i % 5])])[0] for i in range(len(BAD_LINES))]
    if [recs[2 * i]["digest"] for i in range(len(BAD_LINES))] != [w.digest for w in wants]:
        # say whether the batch or the process made the difference
        batch = [Message(id=f"good-{j}", fields=good[j % 5]) for j in range(len(BAD_LINES))]
        here = [x.digest for x in engine.score(batch)]
        first = [recs[2 * i]["digest"] for i in range(len(BAD_LINES))]
        seen = (f"score's pass of {len(batch)} messages: {[d[7:15] for d in first]}; alone: {[w.digest[7:15] for w in wants]}; "
                f"this process's pass of the same {len(batch)}: {[d[7:15] for d in here]}; load average {os.getloadavg()}; "
                f"numerics {recs[0]['model']['numerics']}")
        if here != [w.digest for w in wants]:
            pytest.fail(f"the batch changed digests: {seen}")
        # the rare cross-process outcome (docs/invariance.md, "Open"): a second process must give
        # the digests of this one; a difference that repeats fails
        assert _run(args).returncode == 0
        recs = [orjson.loads(x) for x in out.read_bytes().splitlines()]
        again = [recs[2 * i]["digest"] for i in range(len(BAD_LINES))]
        if again != [w.digest for w in wants]:
            pytest.fail(f"two processes of score differ from this one: {seen}; again: {[d[7:15] for d in again]}")
        warnings.warn(f"docs/invariance.md 'Open': one score process gave other digests, the next the right ones: {seen}",
                      stacklevel=1)
    for i, (_, kind) in enumerate(BAD_LINES):
        ok, bad = recs[2 * i], recs[2 * i + 1]
        assert ok["id"] == f"good-{i}"
        want = wants[i]
        assert ok["digest"] == want.digest
        assert ok["scores"] == orjson.loads(orjson.dumps(want.model_dump()))["scores"]
        assert bad["error"]["kind"] == kind, bad
        assert set(bad) <= {"id", "error"}


def test_strict_exits_1_when_a_line_is_bad(model_dir, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b'{"id": "1", "text": "hello"}\nnot json\n')
    r = _run(["--pack", "spam", "--input", str(inp), "--output", str(tmp_path / "o.jsonl"), "--model", str(model_dir), "--strict"])
    assert r.returncode == 1
    assert len((tmp_path / "o.jsonl").read_bytes().splitlines()) == 2


def test_stdin_to_stdout(model_dir):
    r = _run(["--pack", "spam", "--input", "-", "--output", "-", "--model", str(model_dir)],
             input=b'{"id": "1", "text": "WIN a prize, call now"}\n{"id": 2, "text": "see you at 5"}\n')
    assert r.returncode == 0, r.stderr.decode()
    recs = [orjson.loads(x) for x in r.stdout.splitlines()]
    assert [x["id"] for x in recs] == ["1", "2"]
    assert set(recs[0]["scores"]) == {q.id for q in load_pack("spam").expand()}


def test_unknown_pack_fails_with_exit_2_naming_it(model_dir, tmp_path):
    r = _run(["--pack", "no_such_pack", "--input", "-", "--output", "-", "--model", str(model_dir)], input=b"")
    assert r.returncode == 2
    assert b"no_such_pack" in r.stderr


def test_missing_model_package_names_the_pip_command(tmp_path):
    r = _run(["--pack", "spam", "--input", "-", "--output", "-", "--model", str(tmp_path / "nowhere")], input=b"")
    assert r.returncode == 2
    assert b"nowhere" in r.stderr


@pytest.mark.parametrize(("raw", "kind"), BAD_LINES)
def test_parse_line_kinds(raw, kind):
    got = parse_line(raw, 7)
    if b'"id": "' in raw:
        assert isinstance(got, Decoded)  # the pack's fields are checked by the engine
    else:
        assert got.error.kind == kind and got.error.message.startswith("line 7: ")


def test_a_line_without_an_id_is_named_by_its_file_and_line_number():
    assert parse_line(b'{"text": "hi"}', 12, source="dev.jsonl") == Decoded({"text": "hi"}, "dev.jsonl:12")
    assert parse_line(b'{"id": null, "text": "hi"}', 3).id == "stdin:3"


def test_message_with_braces_is_scored_literally(tiny_models, loaded):
    decoder, tok = loaded(tiny_models("llama"))
    pack = load_pack("spam")
    engine = Engine(decoder, tok, pack, "tiny")
    a, b = engine.score([Message("a", {"text": "pay {amount} now {{x}} {text}"}), Message("b", {"text": "pay 5 now"})])
    assert a.digest != b.digest
    seg = engine.segmenter.prepare(0, "a", {"text": "pay {amount} now {{x}} {text}"})
    head = tok.decode(list(engine.segmenter.preamble_ids) + list(seg.content))
    assert "pay {amount} now {{x}} {text}" in head


def test_run_iter_yields_the_records_of_run_about_one_pass_at_a_time(tiny_models, loaded):
    decoder, tok = loaded(tiny_models("llama"))
    engine = Engine(decoder, tok, load_pack("spam"), "tiny", token_budget=300)
    rows = [orjson.loads(line) for line in (REPO / "examples" / "messages.jsonl").read_bytes().splitlines()]
    prepared = engine.prepare([Message(r["id"], r) for r in rows])
    groups = list(engine.run_iter(prepared))
    assert len(groups) > 1 and all(groups)
    first = 0
    for g in groups:  # each group fits the budget, or is one message alone
        assert len(g) == 1 or sum(p.cost_tokens for p in prepared[first : first + len(g)]) <= 300
        first += len(g)
    flat = [r for g in groups for r in g]
    assert [r.id for r in flat] == [r["id"] for r in rows]
    assert [r.digest for r in flat] == [r.digest for r in engine.run(prepared)]
