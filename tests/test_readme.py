"""The README's runnable blocks (each marked ``<!-- runnable ... -->``) work as written in a fresh
shell: no virtual environment active, a bare PATH, the repository's ``.venv`` set up (as
``make`` leaves it), run in a scratch folder that holds what the README's paths name."""

from __future__ import annotations

import os
import re
import subprocess

import orjson
import pytest
from conftest import REPO, in_ci

pytestmark = pytest.mark.real_model  # the blocks use the default model


def runnable_blocks(text: str) -> list[str]:
    """The bash blocks that follow a ``<!-- runnable`` comment line, in order."""
    return re.findall(r"<!-- runnable[^>]*-->\n```bash\n(.*?)```", text, flags=re.S)


def test_the_readme_marks_the_quick_start_and_the_offline_blocks():
    blocks = runnable_blocks((REPO / "README.md").read_text())
    assert len(blocks) == 2 and blocks[0].startswith("source .venv/bin/activate") and "score --pack" in blocks[1]


def test_the_runnable_blocks_work_in_a_fresh_shell(tmp_path):
    if not (REPO / ".venv" / "bin" / "activate").is_file():
        if in_ci():
            pytest.fail("no .venv under CI: .ci/run runs make test, which makes it")
        pytest.skip("no .venv: the blocks need `make setup` first; `make test` (and CI) always has one")
    for name in (".venv", "examples", "packs"):
        (tmp_path / name).symlink_to(REPO / name)
    script = "set -euo pipefail\n" + "\n".join(runnable_blocks((REPO / "README.md").read_text()))
    keep = {k: os.environ[k] for k in ("HOME", "SPINF_CACHE_DIR", "LANG", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if k in os.environ}
    env = {**keep, "PATH": "/usr/bin:/bin", "COLUMNS": "160"}
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "│ spam " in r.stdout and "Should this text message go to the spam folder?" in r.stdout
    records = [orjson.loads(x) for x in (tmp_path / "s.jsonl").read_bytes().splitlines()]
    assert len(records) == 12 and all("scores" in rec for rec in records)


def test_the_sample_record_is_the_record_a_real_run_writes():
    """bench/readme_record.py --check: the README's sample record equals ex-02's record today
    (numbers to 3 decimals; the machine's numerics line aside)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_record", REPO / "bench" / "readme_record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, "README.md's sample record is stale: run python bench/readme_record.py"
