"""``spinf-stream score`` streams: records are written and flushed as each forward pass finishes,
in input order; Ctrl-C keeps every finished record (exit 130); exit 1 when no line could be
scored; a summary line always, a progress bar only on a terminal. The engine here is a fake slow
one (``tests/fakes.py``): these tests are about the command, not the scores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

from spinf_stream.cli.offline import score_file
from fakes import FAKES, SlowEngine

REPO = Path(__file__).resolve().parents[1]


def _lines(n: int, start: int = 0) -> bytes:
    return b"".join(orjson.dumps({"id": f"m{i}", "text": f"message {i}"}) + b"\n" for i in range(start, start + n))


def _fake_cli(args: list[str], engine: str, **kw) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FAKE_ENGINE": engine, "FAKE_PASS_MESSAGES": "5", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(FAKES), *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)


def test_every_record_of_earlier_passes_is_on_disk_when_a_pass_starts(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(_lines(300))
    engine = SlowEngine(delay_s=0.002, pass_messages=10, watch=dst)
    summary = score_file(engine, str(src), str(dst))
    assert summary.scored == 300 and len(engine.pass_sizes) > 2
    written_before = [sum(engine.pass_sizes[:k]) for k in range(len(engine.pass_sizes))]
    assert engine.lines_at_pass_start == written_before
    assert engine.lines_at_pass_start[-1] > 0  # the first record was out before the last pass began


def test_records_come_out_in_input_order_with_error_records_in_place(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(_lines(7) + b"not json\n" + _lines(5, start=7) + b'{"id": "no-text"}\n')
    score_file(SlowEngine(pass_messages=3), str(src), str(dst))
    out = [orjson.loads(x) for x in dst.read_bytes().splitlines()]
    assert [r.get("id") for r in out] == [f"m{i}" for i in range(7)] + ["in.jsonl:8"] + [f"m{i}" for i in range(7, 12)] + ["no-text"]
    assert [r["error"]["kind"] for r in out if "error" in r] == ["invalid_json", "missing_field"]


def test_ctrl_c_stops_after_the_current_pass_keeping_every_finished_record(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(_lines(300))
    proc = _fake_cli(["score", "--pack", "spam", "--model", "smollm2-135m", "--input", str(src), "--output", str(dst)], "slow:0.2")
    deadline = time.monotonic() + 60
    while not (dst.exists() and len(dst.read_bytes().splitlines()) >= 5):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode() if proc.poll() is not None else "slow"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    out = dst.read_bytes().splitlines()
    assert 5 <= len(out) < 300 and len(out) % 5 == 0  # whole passes only
    assert [orjson.loads(x)["id"] for x in out] == [f"m{i}" for i in range(len(out))]
    text = err.decode()
    assert "Traceback" not in text
    assert "stopping after the current forward pass" in text
    assert f"interrupted after {len(out)} of" in text


def test_exit_1_when_no_line_could_be_scored_naming_the_commonest_error(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    # (a first line without the prompt's field would be a usage mistake: exit 2 before the model loads)
    src.write_bytes(b'not json\n{"id": "a", "body": "x"}\n{"id": "b", "body": "y"}\n')
    proc = _fake_cli(["score", "--pack", "spam", "--model", "smollm2-135m", "--input", str(src), "--output", str(dst)], "slow:0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "no line could be scored: 2 x missing_field" in err.decode()
    assert len(dst.read_bytes().splitlines()) == 3


def test_the_model_line_at_start_and_a_summary_line_but_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(_lines(12) + b"\n")
    proc = _fake_cli(["score", "--pack", "spam", "--model", "smollm2-135m", "--input", str(src), "--output", str(dst)], "slow:0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    lines = err.decode().splitlines()
    assert len(lines) == 4 and "\r" not in err.decode()
    assert lines[0].endswith("model fake-model (sha256 None) on cpu in float32, kernels torch")
    records = [orjson.loads(x) for x in dst.read_bytes().splitlines()]
    answers = Counter(r["scores"]["spam"]["answer"] for r in records if "scores" in r)
    assert lines[1] == "spinf-stream score: spam: " + " / ".join(f"{n} {a}" for a, n in answers.most_common())
    assert lines[2] == "spinf-stream score: errors: 1 (1 empty_value)"
    assert lines[3].startswith("spinf-stream score: scored 12 of 13 lines (1 errors) in ") and lines[3].endswith(str(dst))


def test_the_progress_bar_counts_messages_and_questions(tmp_path, capsys):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(_lines(40))
    score_file(SlowEngine(pass_messages=4), str(src), str(dst), progress=True)
    err = capsys.readouterr().err
    assert "40/40" in err and "msg" in err and "q/s" in err
