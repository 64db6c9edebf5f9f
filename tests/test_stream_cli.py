"""The stream's commands: produce, consume, and dev (embedded broker + real engine on a tiny model)."""

from __future__ import annotations

import os
import subprocess
from collections import Counter

import orjson
import pytest
from pydantic_settings import CliApp

from spinf_stream.stream.broker import EmbeddedBroker, free_port, port_is_free, tansu_binary
from spinf_stream.cli.stream_commands import ConsumeCommand, ProduceCommand
from broker import CLI, REPO, read_all, tansu, tiny_model, topics  # noqa: F401  (fixtures)

pytestmark = pytest.mark.broker


def test_the_tansu_binary_is_found():
    assert os.access(tansu_binary(), os.X_OK)


def test_the_embedded_broker_starts_on_a_free_loopback_port_and_stops():
    with EmbeddedBroker(port=0) as b:
        assert b.running and b.bootstrap_servers.startswith("127.0.0.1:")
        assert not port_is_free(b.port)
    assert not b.running and port_is_free(b.port)


def test_a_busy_port_is_reported():
    from spinf_stream.stream.broker import BrokerError

    with EmbeddedBroker(port=0) as b, pytest.raises(BrokerError, match="in use"):
        EmbeddedBroker(port=b.port).start()


def test_produce_then_consume_round_trips_lines(topics, tmp_path, capsys):
    t = topics(2)
    lines = [orjson.dumps({"id": f"m{i}", "text": f"hello {i}"}) for i in range(5)] + [b"not json"]
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n\n")
    # a .jsonl file is checked line by line unless --no-validate-json (here a raw line is the point)
    CliApp.run(ProduceCommand, cli_args=["--bootstrap-servers", t.bootstrap, "--topic", t.input, "--input", str(src), "--key-field", "id",
                                         "--no-validate-json"])
    recs = read_all(t, [t.input], n=6)
    assert sorted(r.value for r in recs) == sorted(lines)
    assert {r.key for r in recs} == {b"m0", b"m1", b"m2", b"m3", b"m4", None}
    capsys.readouterr()

    CliApp.run(ConsumeCommand, cli_args=["--bootstrap-servers", t.bootstrap, "--topic", t.input, "--max", "6"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6
    assert sorted(o.encode() for o in out) == sorted([*lines[:5], b'"not json"'])


def test_consume_stops_after_the_idle_timeout(topics, capsys):
    t = topics(1)
    CliApp.run(ConsumeCommand, cli_args=["--bootstrap-servers", t.bootstrap, "--topic", t.input, "--timeout-s", "0.5"])
    assert capsys.readouterr().out == ""


def test_dev_publishes_scores_and_prints_the_examples_then_exits(tiny_model):
    """The ``make demo`` path on a tiny model: embedded broker, topics, scorer, example messages."""
    examples = REPO / "examples" / "messages.jsonl"
    n = sum(1 for li in examples.read_bytes().splitlines() if li.strip())
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [*CLI, "dev", "--port", str(free_port()), "--model", str(tiny_model), "--pack", "spam",
         "--token-budget", "4096", "--input", str(examples), "--until-done"],
        cwd=REPO, env=env, capture_output=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    records = [orjson.loads(li) for li in proc.stdout.splitlines()]
    assert len(records) == n
    assert {r["id"] for r in records} == {f"ex-{i:02d}" for i in range(1, n + 1)}
    assert all("scores" in r and r["digest"].startswith("sha256:") for r in records)
    assert b"embedded Kafka broker (Tansu) on 127.0.0.1:" in proc.stderr


def test_dev_print_table_shows_the_messages_in_input_order_and_writes_the_records(tiny_model, tmp_path):
    """``make demo``'s view: one row per published message in input order, the answers shown equal
    the records written to --records, then the summary and where the records are."""
    examples = REPO / "examples" / "messages.jsonl"
    rows = [orjson.loads(li) for li in examples.read_bytes().splitlines() if li.strip()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    env.update(PYTHONPATH=str(REPO), COLUMNS="200")
    out = tmp_path / "demo" / "records.jsonl"
    proc = subprocess.run(
        [*CLI, "dev", "--port", str(free_port()), "--model", str(tiny_model), "--pack", "spam",
         "--token-budget", "4096", "--input", str(examples), "--until-done", "--print", "table", "--records", str(out)],
        cwd=REPO, env=env, capture_output=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    records = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert set(records) == {r["id"] for r in rows}
    shown = proc.stdout.decode()
    table_rows = [line for line in shown.splitlines() if " ex-" in line]
    assert [line.split()[1] for line in table_rows] == [r["id"] for r in rows]  # input order, not partition order
    for line, row in zip(table_rows, rows):
        s = records[row["id"]]["scores"]["spam"]
        p = s["choices"][s["answer"]].get("calibrated", s["choices"][s["answer"]]["probability"])
        assert f"{s['answer']} {p:.2f}" in line and " ".join(row["text"].split())[:20] in line
    answers = Counter(r["scores"]["spam"]["answer"] for r in records.values())
    assert "\nspam: " + " / ".join(f"{n} {a}" for a, n in answers.most_common()) + "\nerrors: 0\n" in shown
    assert f"records (JSON Lines, one per message): {out}" in proc.stderr.decode()


def test_dev_with_routes_prints_one_record_per_message_and_pack_equal_to_offline_scores(tiny_model, tmp_path):
    """``dev --routes``: the input goes to the first route's first topic; every message gets a
    record from each of its route's packs, bitwise equal to offline scoring with that pack."""
    from spinf_stream.engine import Engine, Message

    examples = REPO / "examples" / "messages.jsonl"
    rows = [orjson.loads(li) for li in examples.read_bytes().splitlines() if li.strip()]
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        "dead_letter_topic: dev.dlq\n"
        "routes:\n"
        "  - topics: [messages]\n"
        f"    packs: [{{pack: spam, model: {tiny_model}, token_budget: 4096}}, {{pack: sentiment, model: {tiny_model}, token_budget: 4096}}]\n"
        "    output_topic: 'scores.{pack}'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [*CLI, "dev", "--port", str(free_port()), "--routes", str(routes), "--input", str(examples), "--until-done"],
        cwd=REPO, env=env, capture_output=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    got = Counter()
    digests = {}
    for r in map(orjson.loads, proc.stdout.splitlines()):
        got[r["pack"]["name"]] += 1
        digests[(r["pack"]["name"], r["id"])] = r["digest"]
    assert got == {"spam": len(rows), "sentiment": len(rows)}
    for pack in ("spam", "sentiment"):
        engine = Engine.load(model=str(tiny_model), pack=pack, token_budget=4096)
        for rec in engine.score([Message(id=r["id"], fields=r) for r in rows]):
            assert digests[(pack, rec.id)] == rec.digest, (pack, rec.id)


def test_dev_serves_the_three_request_shapes_beside_its_stream(tiny_model, tmp_path):
    """``dev --api-port P`` (no --until-done): spinf's, SGLang's and OpenAI's requests answered
    while the embedded broker's stream runs."""
    import httpx

    from test_api import wait_for_api

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*CLI, "dev", "--port", str(free_port()), "--model", str(tiny_model), "--pack", "spam",
                                 "--token-budget", "512", "--api-port", str(port), "--input", str(REPO / "examples" / "messages.jsonl")],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        url = wait_for_api(port, proc, log)
        spinf = httpx.post(f"{url}/v1/score", json={"pack": "spam", "messages": [{"text": "WIN a prize"}]}, timeout=60)
        items = httpx.post(f"{url}/v1/score", json={"query": "Spam? ", "items": ["a", "b"], "label_token_ids": [1, 2]}, timeout=60)
        echo = httpx.post(f"{url}/v1/completions", json={"prompt": "Spam? a", "echo": True, "max_tokens": 0, "logprobs": 1},
                          timeout=60)
        assert spinf.status_code == items.status_code == echo.status_code == 200, (spinf.text, items.text, echo.text)
        assert spinf.json()["records"][0]["digest"].startswith("sha256:")
        assert len(items.json()["scores"]) == 2 and echo.json()["choices"][0]["logprobs"]["token_logprobs"][0] is None
    finally:
        proc.terminate()
        proc.wait(60)
