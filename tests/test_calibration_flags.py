"""``--calibration FILE|auto|none`` on ``score``, ``run`` and ``dev`` reaches ``Engine.load``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic_settings import CliApp

from spinf_stream.engine import Engine
from spinf_stream.cli.offline import ScoreCommand
from spinf_stream.stream.app import load_engine
from spinf_stream.cli.stream_commands import DevCommand, RunCommand


@pytest.fixture
def loads(monkeypatch):
    """Records the keyword arguments of every ``Engine.load`` instead of loading."""
    calls: list[dict] = []

    def fake_load(*args, **kwargs):
        calls.append(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(Engine, "load", staticmethod(fake_load))
    monkeypatch.delenv("SPINF_CALIBRATION", raising=False)
    return calls


def _parse(cmd, args):
    """The command's settings from ``args`` and the environment, without running it."""
    return cmd(_cli_parse_args=args)


@pytest.mark.parametrize("cmd", [RunCommand, DevCommand])
def test_the_service_commands_default_to_the_shipped_calibration(cmd, loads):
    assert _parse(cmd, []).calibration == "auto"


@pytest.mark.parametrize("cmd", [RunCommand, DevCommand])
def test_the_service_commands_take_a_calibration_flag_and_variable(cmd, loads, monkeypatch):
    assert _parse(cmd, ["--calibration", "none"]).calibration == "none"
    monkeypatch.setenv("SPINF_CALIBRATION", "/x/CAL.json")
    assert _parse(cmd, []).calibration == "/x/CAL.json"


def test_the_service_loads_the_engine_with_its_calibration(loads):
    settings = RunCommand(calibration="/x/CAL.json")
    with pytest.raises(SystemExit):
        load_engine(settings)
    assert loads[-1]["calibration"] == "/x/CAL.json"


@pytest.mark.parametrize(("args", "want"), [([], "auto"), (["--calibration", "none"], "none"), (["--calibration", "c.json"], "c.json")])
def test_score_loads_the_engine_with_its_calibration(args, want, loads, tmp_path, monkeypatch):
    # a real calibration of the shipped spam pack: score checks the file before the weights load
    shipped = Path(__file__).resolve().parents[1] / "packs" / "spam" / "calibrations" / "qwen2.5-coder-0.5b.json"
    shutil.copy(shipped, tmp_path / "c.json")
    monkeypatch.chdir(tmp_path)
    base = ["--pack", "spam", "--input", "-", "--output", str(tmp_path / "o.jsonl")]
    with pytest.raises(SystemExit):
        CliApp.run(ScoreCommand, cli_args=base + args)
    assert loads[-1]["calibration"] == want
