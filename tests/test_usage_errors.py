"""Every usage mistake: exit 2, one line on stderr naming the problem (flag, variable, value, what
is allowed), no traceback, and no model loaded; broker and file mistakes within 5 s.

The commands run in a subprocess through ``tests/fakes.py``, where loading a model prints
``MODEL LOADED`` and exits 99: a mistake reported before that point never waited for weights.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic_settings import CliApp

from spinf_stream.cli import SpinfStream
from spinf_stream.stream.broker import free_port
from spinf_stream.cli.usage import options, subcommands
from broker import tansu, topics  # noqa: F401  (fixtures)
from fakes import FAKES, TRAP_EXIT

REPO = Path(__file__).resolve().parents[1]
FAST_S = 5.0


def fast_s() -> float:
    """:data:`FAST_S` on an idle machine, stretched by the load beside the test (the 1-minute load
    average per CPU, when over 1: the other xdist worker, a benchmark): what it guards against is
    a wait on a network timeout or a retry, not a slow start under load."""
    return FAST_S * max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)))

NEWS_PACK = """\
name: news
version: 1.0.0
description: two fields
prompt: "{title}\\n{text}\\n"
question: "{question}"
choices: [yes, no]
questions:
  - id: sport
    text: Is it about sport?
"""


def spinf(args: list[str], env: dict[str, str] | None = None, cwd: Path = REPO) -> tuple[subprocess.CompletedProcess[bytes], float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") or k in ("SPINF_CACHE_DIR",)}
    # no API unless a case asks: cases that get past the checks must not race for port 8000
    clean.update({"FAKE_ENGINE": "trap", "PYTHONPATH": str(REPO), "SPINF_API_PORT": "0"}, **(env or {}))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(FAKES), *args], cwd=cwd, env=clean, capture_output=True, timeout=120)
    return proc, time.monotonic() - start


def assert_usage_error(proc: subprocess.CompletedProcess[bytes], *expected: str) -> str:
    err = proc.stderr.decode()
    assert "MODEL LOADED" not in err, "the model was loaded before the mistake was reported"
    assert proc.returncode == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("spinf-stream"), err
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("usage")
    (d / "in.jsonl").write_bytes(b'{"id": "1", "text": "hello"}\n')
    (d / "a_file").write_text("x")
    (d / "news.yaml").write_text(NEWS_PACK)
    (d / "typo.yaml").write_text(NEWS_PACK.replace("choices:", "choises:"))
    (d / "bad.jsonl").write_bytes(b'{"id": "1", "text": "ok"}\n\n{"id": "2", "text": "cut\n')
    (d / "field.yaml").write_text(NEWS_PACK.replace('prompt: "{title}\\n{text}\\n"', 'prompt: "{txt}\\n"'))
    (d / "one.yaml").write_text(NEWS_PACK.replace("choices: [yes, no]", "choices: [friendly]"))
    route = "routes:\n  - topics: [messages]\n    packs:\n      - {pack: spam, model: smollm2-135m}\n      - {%s}\n"
    (d / "r_typo.yaml").write_text(route % "pack: sentiment, modle: smollm2-135m")
    (d / "r_pack.yaml").write_text(route % "pack: no_such_pack, model: smollm2-135m")
    (d / "r_tmpl.yaml").write_text((route % "pack: sentiment") + "    output_topic: 'scores.{topic}'\n")
    (d / "r_cal.yaml").write_text(route % "pack: sentiment, calibration: recall90")
    (d / "r_yaml.yaml").write_text("routes: [\n")
    (d / "r_ok.yaml").write_text(route % "pack: sentiment")
    return {"in": str(d / "in.jsonl"), "dir": str(d), "file": str(d / "a_file"), "out": str(d / "out" / "o.jsonl"),
            "news": str(d / "news.yaml"), "typo": str(d / "typo.yaml"), "bad_jsonl": str(d / "bad.jsonl"), "field": str(d / "field.yaml"), "one": str(d / "one.yaml"),
            **{k: str(d / f"{k}.yaml") for k in ("r_typo", "r_pack", "r_tmpl", "r_cal", "r_yaml", "r_ok")}}


def score(files: dict[str, str], *extra: str) -> list[str]:
    base = {"--pack": "spam", "--model": "smollm2-135m", "--input": files["in"], "--output": files["out"]}
    for flag, value in zip(extra[::2], extra[1::2]):
        base[flag] = value
    return ["score", *[x for kv in base.items() for x in kv]]


#: a listening socket held for the module: the port "serve on a busy port" asks for
BUSY = socket.create_server(("127.0.0.1", 0))

# name, args (a function of the files), env, texts the line must contain, timed (a broker or file mistake)
CASES = [
    ("negative window", lambda f: ["run", "--window-ms", "-5"], {}, ["--window-ms -5", "≥ 0", "SPINF_WINDOW_MS"], False),
    ("window from env not a number", lambda f: ["run"], {"SPINF_WINDOW_MS": "abc"}, ["SPINF_WINDOW_MS=abc", "whole number", "--window-ms"], False),
    ("missing required flags", lambda f: ["score", "--pack", "spam"], {}, ["--input FILE is required", "SPINF_INPUT"], False),
    ("SASL without a mechanism", lambda f: ["run", "--security-protocol", "SASL_SSL"], {}, ["--security-protocol SASL_SSL needs --sasl-mechanism", "SCRAM-SHA-512"], False),
    ("SASL without credentials", lambda f: ["run", "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN"], {}, ["--sasl-username", "SPINF_SASL_PASSWORD"], False),
    ("cert without key", lambda f: ["run", "--ssl-certfile", f["file"]], {}, ["--ssl-keyfile", "together"], False),
    ("unknown input format", lambda f: ["run", "--input-format", "xml"], {}, ["--input-format xml", "one of json, text"], False),
    ("misspelt flag", lambda f: ["run", "--windw-ms", "3"], {}, ["unknown option --windw-ms", "did you mean --window-ms"], False),
    ("value after an on/off flag", lambda f: ["score", "--strict", "yes"], {}, ["unexpected argument 'yes'", "--no-strict"], False),
    ("flag without its value", lambda f: ["run", "--token-budget"], {}, ["--token-budget needs a value"], False),
    ("unknown command", lambda f: ["rn"], {}, ["unknown command 'rn'", "score, evaluate, calibrate, labels, run, dev, serve, produce, consume, packs"], False),
    ("no command", lambda f: [], {}, ["choose a command"], False),
    ("bad dtype from env", lambda f: ["run"], {"SPINF_DTYPE": "fp16"}, ["SPINF_DTYPE=fp16", "auto, float32, bfloat16, fp8"], False),
    ("bad boolean from env", lambda f: ["run"], {"SPINF_ENABLE_IDEMPOTENCE": "maybe"}, ["SPINF_ENABLE_IDEMPOTENCE=maybe", "true or false"], False),
    ("heartbeat above session timeout", lambda f: ["run", "--heartbeat-interval-ms", "50000"], {}, ["--heartbeat-interval-ms 50000 must be below --session-timeout-ms"], False),
    ("unknown device", lambda f: score(f, "--device", "gpu"), {}, ["--device gpu", "auto, cpu, cuda or cuda:N"], False),
    ("fp8 on the CPU", lambda f: score(f, "--device", "cpu", "--dtype", "fp8"), {}, ["--dtype fp8", "use --dtype float32"], False),
    ("dev with fp8 on the CPU, before its broker starts", lambda f: ["dev", "--device", "cpu", "--dtype", "fp8", "--port", "0"], {}, ["--dtype fp8", "use --dtype float32"], False),
    ("unknown kernel back end", lambda f: score(f), {"SPINF_KERNELS": "bogus"}, ["SPINF_KERNELS='bogus'", "torch, triton, cublas"], False),
    ("triton on the CPU without the interpreter", lambda f: score(f, "--device", "cpu"), {"SPINF_KERNELS": "triton", "TRITON_INTERPRET": "0"}, ["SPINF_KERNELS=triton", "TRITON_INTERPRET=1"], False),
    ("triton on the CPU in bfloat16", lambda f: score(f, "--device", "cpu", "--dtype", "bfloat16"), {"SPINF_KERNELS": "triton", "TRITON_INTERPRET": "1"}, ["float32 only", "--dtype float32"], False),
    ("cublas on the CPU", lambda f: score(f, "--device", "cpu"), {"SPINF_KERNELS": "cublas"}, ["cublas", "CUDA"], False),
    ("unknown pack", lambda f: score(f, "--pack", "no_such_pack"), {}, ["no_such_pack", "no such pack"], True),
    ("unknown key in the pack", lambda f: score(f, "--pack", f["typo"]), {}, ["typo.yaml", "choises", "unknown key", "choices"], True),
    ("text input with a two-field pack", lambda f: score(f, "--pack", f["news"], "--input-format", "text"), {}, ["--input-format text", "exactly one field", "{title}, {text}"], True),
    ("missing input file", lambda f: score(f, "--input", f["dir"] + "/missing.jsonl"), {}, ["--input", "missing.jsonl", "SPINF_INPUT", "no such file"], True),
    ("input is a directory", lambda f: score(f, "--input", f["dir"]), {}, ["--input", "is a directory"], True),
    ("output under a file", lambda f: score(f, "--output", f["file"] + "/o.jsonl"), {}, ["--output", "SPINF_OUTPUT", "cannot create its directory"], True),
    ("output is the input", lambda f: score(f, "--output", f["in"]), {}, ["--output", "is the input file"], True),
    ("unknown model", lambda f: score(f, "--model", "no-such-model"), {}, ["no-such-model", "qwen2.5-coder-0.5b"], False),
    ("missing calibration file", lambda f: score(f, "--calibration", f["dir"] + "/nope.json"), {}, ["--calibration", "nope.json", "SPINF_CALIBRATION", "no such file"], True),
    ("calibration file that is not one", lambda f: score(f, "--calibration", f["in"]), {}, ["invalid calibration", "in.jsonl"], True),
    ("a prompt field the input lacks", lambda f: score(f, "--pack", f["field"]), {}, ["prompt uses {txt}", "first line of", "(its fields: id, text)"], True),
    ("one choice", lambda f: score(f, "--pack", f["one"]), {}, ["one.yaml", "choices", "always gets probability 1"], True),
    ("unknown pack name", lambda f: score(f, "--pack", "spma"), {}, ["no such pack", "the packs there:", "spam"], True),
    ("unknown calibration name", lambda f: score(f, "--calibration", "recall90"), {}, ["--calibration recall90", "shipped: auto, recall95"], True),
    ("calibration of another pack", lambda f: score(f, "--pack", "sentiment", "--calibration", str(REPO / "packs" / "spam" / "calibrations" / "qwen2.5-coder-0.5b.json")), {}, ["is for pack spam", "not sentiment", "--calibration none"], True),
    ("evaluate without labelled input", lambda f: ["evaluate", "--pack", "spam", "--input", f["dir"] + "/none.jsonl", "--report", f["dir"] + "/r.json"], {}, ["--input", "none.jsonl", "no such file"], True),
    ("calibrate with a bad target", lambda f: ["calibrate", "--pack", "spam", "--input", f["in"], "--output", f["dir"] + "/c.json", "--target", "recall"], {}, ["--target", "precision=P or recall=R"], False),
    ("missing routes file", lambda f: ["run", "--routes", f["dir"] + "/nope.yaml"], {}, ["routes file", "nope.yaml", "does not exist", "SPINF_ROUTES"], True),
    ("routes file that is not YAML", lambda f: ["run", "--routes", f["r_yaml"]], {}, ["r_yaml.yaml", "not valid YAML"], True),
    ("misspelt key in a routes file", lambda f: ["run", "--routes", f["r_typo"]], {}, ["r_typo.yaml", "routes[0].packs[1].modle", "Extra inputs"], True),
    ("unknown pack in a routes file", lambda f: ["run", "--routes", f["r_pack"]], {}, ["r_pack.yaml", "routes[0].packs[1].pack", "no such pack"], True),
    ("unknown placeholder in a routes file", lambda f: ["run", "--routes", f["r_tmpl"]], {}, ["r_tmpl.yaml", "routes[0].output_topic", "{topic}", "{pack}"], True),
    ("unknown calibration in a routes file", lambda f: ["run", "--routes", f["r_cal"]], {}, ["r_cal.yaml", "routes[0].packs[1].calibration", "recall90"], True),
    ("--pack beside --routes", lambda f: ["run", "--routes", f["r_ok"], "--pack", "spam"], {}, ["--pack and --routes", "routes file"], True),
    ("dev --until-done without --input", lambda f: ["dev", "--until-done"], {}, ["--until-done", "needs --input"], True),
    ("bootstrap without a port", lambda f: ["run", "--bootstrap-servers", "kafka"], {}, ["--bootstrap-servers 'kafka'", "host:port"], True),
    ("broker not listening", lambda f: ["run", "--bootstrap-servers", f"127.0.0.1:{free_port()}"], {}, ["cannot reach the Kafka broker", "connection refused", "SPINF_BOOTSTRAP_SERVERS"], True),
    ("broker host does not resolve", lambda f: ["run", "--bootstrap-servers", "no-such-host.invalid:9092"], {}, ["no-such-host.invalid:9092", "does not resolve"], True),
    ("produce to an unreachable broker", lambda f: ["produce", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--topic", "t", "--input", f["in"]], {}, ["cannot reach the Kafka broker"], True),
    ("produce a .jsonl line that is not JSON", lambda f: ["produce", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--topic", "t", "--input", f["bad_jsonl"]], {}, ["non-blank line 2 is not JSON", "nothing was published", "--no-validate-json"], True),
    ("produce a missing file", lambda f: ["produce", "--topic", "t", "--input", f["dir"] + "/nope.jsonl"], {}, ["--input", "no such file"], True),
    ("serve with an unknown pack", lambda f: ["serve", "--pack", "spma"], {}, ["no such pack", "spam"], True),
    ("serve with the API off", lambda f: ["serve"], {}, ["--api-port 0", "turns the API off", "give it a port"], True),
    ("serve on a port out of range", lambda f: ["serve", "--api-port", "70000"], {}, ["--api-port 70000", "≤ 65535", "SPINF_API_PORT"], True),
    ("serve on a busy port", lambda f: ["serve", "--api-port", str(BUSY.getsockname()[1])], {}, ["--api-port", "cannot listen", "in use"], True),
    ("serve with an unknown model", lambda f: ["serve", "--api-port", str(free_port()), "--model", "no-such-model"], {}, ["no-such-model", "qwen2.5-coder-0.5b"], False),
    ("consume from an unreachable broker", lambda f: ["consume", "--bootstrap-servers", f"127.0.0.1:{free_port()}", "--topic", "t"], {}, ["cannot reach the Kafka broker"], True),
]


@pytest.mark.parametrize(("name", "args", "env", "expected", "timed"), CASES, ids=[c[0] for c in CASES])
def test_a_usage_mistake_is_one_line_exit_2_before_any_model_loads(files, name, args, env, expected, timed):
    proc, seconds = spinf(args(files), env)
    assert_usage_error(proc, *expected)
    if timed:
        limit = fast_s()
        assert seconds < limit, f"{seconds:.1f} s from the typo to its error (limit {limit:.1f} s at this load)"


def test_the_table_covers_at_least_fifteen_mistakes():
    assert len(CASES) >= 15


def test_cuda_without_a_gpu_says_to_use_the_cpu(files):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU, so --device cuda is usable here; the test runs on machines without one (CI)")
    proc, _ = spinf(score(files, "--device", "cuda"))
    assert_usage_error(proc, "--device cuda", "no CUDA GPU is visible", "use --device cpu")


def test_debug_log_level_shows_the_traceback(files):
    proc, _ = spinf(score(files, "--input", files["dir"] + "/missing.jsonl", "--log-level", "DEBUG"))
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" in err and err.strip().splitlines()[-1].startswith("spinf-stream score: error:")


@pytest.mark.broker
def test_a_missing_input_topic_is_an_error_naming_the_topic_and_the_escape_hatch(topics):
    t = topics(1)
    proc, seconds = spinf(["run", "--bootstrap-servers", t.bootstrap, "--input-topic", "no-such-topic", "--model", "smollm2-135m"])
    assert_usage_error(proc, "input topic no-such-topic does not exist", t.input, "--allow-missing-topics")
    assert seconds < fast_s()


@pytest.mark.broker
def test_allow_missing_topics_warns_and_goes_on_to_load_the_model(topics):
    t = topics(1)
    proc, _ = spinf(["run", "--bootstrap-servers", t.bootstrap, "--input-topic", "later-topic", "--output-topic", t.output,
                     "--dlq-topic", t.dlq, "--model", "smollm2-135m", "--allow-missing-topics"])
    err = proc.stderr.decode()
    assert proc.returncode == TRAP_EXIT, err
    assert "later-topic does not exist" in err and "WARNING" in err


@pytest.mark.broker
def test_missing_output_topics_are_created_before_the_model_loads(topics):
    from aiokafka.admin import AIOKafkaAdminClient

    t = topics(2)
    out, dlq = f"{t.output}-new", f"{t.dlq}-new"
    proc, _ = spinf(["run", "--bootstrap-servers", t.bootstrap, "--input-topic", t.input, "--output-topic", out,
                     "--dlq-topic", dlq, "--model", "smollm2-135m"])
    assert proc.returncode == TRAP_EXIT, proc.stderr.decode()

    async def described() -> list[dict]:
        admin = AIOKafkaAdminClient(bootstrap_servers=t.bootstrap)
        await admin.start()
        try:
            return await admin.describe_topics([out, dlq])
        finally:
            await admin.close()

    meta = {d["topic"]: d for d in asyncio.run(described())}
    assert set(meta) == {out, dlq}
    assert all(len(meta[n]["partitions"]) == 2 for n in (out, dlq))  # like the input topic


@pytest.mark.broker
def test_produce_to_a_missing_topic_names_it(topics, files):
    t = topics(1)
    proc, seconds = spinf(["produce", "--bootstrap-servers", t.bootstrap, "--topic", "no-such-topic", "--input", files["in"]])
    assert_usage_error(proc, "--topic no-such-topic", "does not exist")
    assert seconds < fast_s()


# -- --help and --version ----------------------------------------------------------------------


def _help(command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    from pydantic_settings import CliSettingsSource

    from spinf_stream.cli.usage import argument_adder

    monkeypatch.setenv("COLUMNS", "10000")  # no wrapping: argparse breaks lines at hyphens

    with pytest.raises(SystemExit):
        CliApp.run(SpinfStream, cli_args=[*command.split(), "--help"],
                   cli_settings_source=CliSettingsSource(SpinfStream, add_argument_method=argument_adder(SpinfStream)))
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(subcommands(SpinfStream)) + ["packs list", "packs show"])
def test_help_shows_each_options_variable_default_and_allowed_values_in_plain_words(command, capsys, monkeypatch):
    text = _help(command, capsys, monkeypatch)
    prefix = command.replace(" ", ".") + "."
    for dest, opt in options(SpinfStream).items():
        if not dest.startswith(prefix) or "." in dest[len(prefix):]:
            continue  # another command's, or a subcommand's (its own help lists it)
        assert opt.flag in text, opt.flag
        if opt.env:
            assert f"env: {opt.env}" in text, opt.flag
        assert ("default: " + opt.default()) in text or opt.default() == "required", opt.flag
        if not opt.is_flag and opt.allowed() != "any text":
            assert opt.allowed() in text, opt.flag
    for internal in ("{Path,null}", "Path,null", "list[str]", "SecretStr", ",null}", "(default: null)"):
        assert internal not in text, internal


def test_every_command_reads_spinf_variables():
    for command, model in subcommands(SpinfStream).items():
        assert all(o.env and o.env.startswith("SPINF_") for d, o in options(SpinfStream).items()
                   if d.startswith(command + ".") and not o.positional), command  # PACK of `packs show` is the command line's


def test_version_prints_the_versions_and_the_gpus():
    proc = subprocess.run([sys.executable, "-m", "spinf_stream.cli", "--version"], cwd=REPO, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode()
    import importlib.metadata

    import torch

    assert f"spinf-stream {importlib.metadata.version('spinf-stream')}" in out
    assert f"torch {torch.__version__}" in out
    assert f"triton {importlib.metadata.version('triton')}" in out
    assert ("GPU cuda:0" in out) == torch.cuda.is_available()
