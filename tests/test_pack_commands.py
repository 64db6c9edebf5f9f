"""``spinf-stream packs list`` and ``packs show``: what each pack asks, read from the pack files
and their calibrations folders (no YAML reading needed by the user)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

from spinf_stream.packs import load_pack


def _packs(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}
    env.pop("SPINF_PACKS_DIR", None)
    return subprocess.run([sys.executable, "-m", "spinf_stream.cli", "packs", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_packs_list_shows_every_shipped_pack_with_version_questions_and_calibrations():
    r = _packs("list")
    assert r.returncode == 0, r.stderr
    files = sorted((REPO / "packs").glob("*.yaml"))
    assert len(files) >= 10
    for f in files:
        pack = load_pack(f)
        (row,) = [line for line in r.stdout.splitlines() if line.startswith(f"│ {pack.name} ")]
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[1] == pack.version
        assert cells[2].split()[0] == str(len(pack.expand()))
        models = sorted(p.stem for p in (f.parent / f.stem / "calibrations").glob("*.json"))
        assert cells[3] == (", ".join(models) or "-")
    (spam,) = [line for line in r.stdout.splitlines() if line.startswith("│ spam ")]
    assert "recall95" in spam


def test_packs_show_prints_the_expanded_questions_the_prompt_and_token_counts():
    r = _packs("show", "moderation", "--message", '{"text": "you are all idiots"}')
    assert r.returncode == 0, r.stderr
    pack = load_pack("moderation")
    for q in pack.expand():
        assert f"│ {q.id} " in r.stdout
    assert pack.preamble.splitlines()[0] in r.stdout and "you are all idiots" in r.stdout
    counted = _packs("show", "spam", "--model", "smollm2-135m")
    assert counted.returncode == 0, counted.stderr
    assert "tokens (smollm2-135m): preamble " in counted.stdout and "branch tokens" in counted.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["show", "spma"], "no such pack"),
    (["show", "spam", "--message", '{"body": "x"}'], "prompt uses {text}"),
    ([], "choose list or show"),
])
def test_packs_mistakes_are_one_line_and_exit_2(args, says):
    r = _packs(*args)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
