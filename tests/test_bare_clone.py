"""A bare clone (no ``../shared/data`` beside it) passes: data tests skip saying how to run them,
and fail instead when ``CI`` is set (CI always has the data)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = '''
from conftest import dataset

def test_uses_the_data():
    assert dataset("sms_spam", 1)
'''


def _run_probe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "SPINF_DATA_DIR")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
         "--confcutdir", str(REPO / "tests"), str(tmp_path / "test_probe.py")],
        cwd=REPO / "tests", env={**clean, "PYTHONPATH": str(REPO / "tests"), **env}, capture_output=True, text=True, timeout=300,
    )


def test_without_the_data_a_data_test_skips_saying_how_to_run_it(tmp_path):
    proc = _run_probe(tmp_path, SPINF_DATA_DIR=str(tmp_path / "no-data"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout and "SPINF_DATA_DIR=" in proc.stdout


def test_without_the_data_under_ci_a_data_test_fails_with_a_clear_message(tmp_path):
    proc = _run_probe(tmp_path, SPINF_DATA_DIR=str(tmp_path / "no-data"), CI="true")
    assert proc.returncode == 1
    assert "1 failed" in proc.stdout and "CI must have them" in proc.stdout


def test_spinf_data_dir_points_the_tests_at_the_data(tmp_path):
    data = tmp_path / "data" / "sms_spam"
    data.mkdir(parents=True)
    (data / "dev.jsonl").write_text('{"id": "x", "text": "hi", "label": "ham"}\n')
    proc = _run_probe(tmp_path, SPINF_DATA_DIR=str(tmp_path / "data"), CI="true")
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
