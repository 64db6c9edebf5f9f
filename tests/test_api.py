"""The HTTP API over a real port with a real HTTP client (httpx): ``spinf-stream serve`` on a tiny
model (records bitwise equal to offline scoring), and the API's limits, keys and error shape on
a deterministic stand-in for the engine (FakeScorer)."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from broker import CLI, REPO, FakeScorer, fake_record, tansu, tiny_model, topics  # noqa: F401  (fixtures)
from spinf_stream.api.app import create_app, models_of
from spinf_stream.api.scoring import ApiScoring, Lane
from spinf_stream.api.serve import ApiServer, bind
from spinf_stream.stream.broker import free_port
from spinf_stream.packs import load_pack
from spinf_stream.stream.engine_thread import EngineThread

SPAM = load_pack("spam")


def fake(**kwargs: Any) -> FakeScorer:
    """The stand-in reading the shipped spam pack."""
    return FakeScorer(pack=SPAM, **kwargs)

# -- in process, on the stand-in ---------------------------------------------------------------


@dataclass
class Served:
    url: str
    scoring: ApiScoring


@contextmanager
def serving(scorers: dict[str, FakeScorer] | None = None, *, max_queued: int = 4096, window_s: float = 0.005,
            telemetry: Any = None, inline_packs: bool = True, **app_kwargs: Any) -> Iterator[Served]:
    """The API on a FakeScorer per calibration (``auto``, ``none``), on a loop of its own thread,
    reporting to ``telemetry`` (``None``: nowhere)."""
    scorers = scorers or {"auto": fake(), "none": fake()}
    lanes = [Lane(f"spam|{c}", s.pack.name, s.pack.version, c, s) for c, s in scorers.items()]
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}
    with EngineThread() as engine:
        scoring = ApiScoring(lanes, engine, token_budget=4096, window_s=window_s, max_queued=max_queued, telemetry=telemetry,
                             inline_packs=inline_packs)
        app = create_app(scoring, models=models_of(scoring), telemetry=telemetry, **app_kwargs)
        sock = bind("127.0.0.1", 0)

        async def main() -> None:
            server = ApiServer(app, sock)
            scoring.start()
            await server.start()
            box["stop"] = asyncio.Event()
            started.set()
            await box["stop"].wait()
            await server.stop()
            await scoring.stop()

        thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
        thread.start()
        assert started.wait(30)
        try:
            yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", scoring)
        finally:
            loop.call_soon_threadsafe(box["stop"].set)
            thread.join(30)
            loop.close()


def error_of(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param"}, body
    return body["error"]


def test_score_returns_one_record_per_message_in_order_with_error_records_in_place():
    scorer = fake()
    msgs = [{"id": "a", "text": "hello"}, {"text": "no id here"}, {"id": 7, "text": "an integer id"},
            {"id": "m", "body": "no text field"}, {"id": ["x"], "text": "a list id"}, {"id": "e", "text": "   "}]
    with serving({"auto": scorer}) as s:
        r = httpx.post(f"{s.url}/v1/score", json={"pack": "spam", "messages": msgs})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "spinf.score"
    recs = body["records"]
    assert [x["id"] for x in recs] == ["a", "1", "7", "m", "4", "e"]
    for i in (0, 1, 2):
        want = fake_record(recs[i]["id"], msgs[i]["text"], scorer)
        assert recs[i] == want.model_dump(mode="json")  # the record offline score writes
    assert recs[3]["error"]["kind"] == "missing_field" and recs[4]["error"]["kind"] == "wrong_type"
    assert recs[5]["error"]["kind"] == "empty_field"
    # usage: the stand-in's token counts (its definition: 10 + len(text) // 4) of the scored ones
    n = sum(10 + len(msgs[i]["text"]) // 4 for i in (0, 1, 2))
    assert body["usage"] == {"prompt_tokens": n, "computed_tokens": n}


def test_requests_that_arrive_together_share_a_pass_and_get_their_own_records():
    scorer = fake()
    with serving({"auto": scorer}, window_s=0.2) as s:
        async def go() -> list[httpx.Response]:
            async with httpx.AsyncClient() as c:
                return await asyncio.gather(*[
                    c.post(f"{s.url}/v1/score", json={"pack": "spam", "messages": [{"id": f"r{i}", "text": f"text {i}"}]})
                    for i in range(6)])
        rs = asyncio.run(go())
    for i, r in enumerate(rs):
        (rec,) = r.json()["records"]
        assert rec == fake_record(f"r{i}", f"text {i}", scorer).model_dump(mode="json")
    assert sum(scorer.batches) == 6 and len(scorer.batches) < 6  # batched across requests


def test_the_calibration_picks_the_lane_and_the_pack_may_name_its_version():
    auto, none = fake(), fake()
    with serving({"auto": auto, "none": none}) as s:
        for cal, scorer in (("none", none), ("auto", auto), (None, auto)):
            body = {"pack": f"spam@{SPAM.version}", "messages": [{"text": "x"}]} | ({"calibration": cal} if cal else {})
            before = len(scorer.batches)
            assert httpx.post(f"{s.url}/v1/score", json=body).status_code == 200
            assert len(scorer.batches) == before + 1, cal


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"pack": "nope", "messages": [{"text": "x"}]}, 404, "pack"),
    ({"pack": "spam@9.9.9", "messages": [{"text": "x"}]}, 404, "pack"),
    ({"pack": "spam", "model": "other", "messages": [{"text": "x"}]}, 404, "model"),
    ({"pack": "spam", "messages": []}, 400, "messages"),
    ({"pack": "spam", "messages": "hello"}, 400, "messages"),
    ({"pack": "spam", "messages": [1, 2]}, 400, "messages.0"),
    ({"pack": "spam", "messages": [{"text": "x"}], "calibration": "recall95"}, 404, "calibration"),
    ({"messages": [{"text": "x"}]}, 400, "pack"),
    ({"pack": "spam", "messages": [{"text": "x"}], "extra": 1}, 400, "extra"),
    ({"pack": "spam", "messages": [{"text": "x"}] * 11}, 400, "messages"),
])
def test_bad_requests_get_one_error_shape_naming_the_field(body, status, param):
    with serving(max_messages=10) as s:
        r = httpx.post(f"{s.url}/v1/score", json=body)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["param"] == param and err["type"] == {400: "invalid_request_error", 404: "not_found_error"}[status]


def test_a_body_that_is_not_json_is_a_400():
    with serving() as s:
        r = httpx.post(f"{s.url}/v1/score", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and error_of(r)["type"] == "invalid_request_error"


def test_an_oversized_body_is_a_413_by_length_and_when_streamed():
    big = orjson.dumps({"pack": "spam", "messages": [{"text": "x" * 5000}]})
    with serving(max_body_bytes=4096) as s:
        r = httpx.post(f"{s.url}/v1/score", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and error_of(r)["type"] == "request_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer
            for i in range(0, len(big), 1000):
                yield big[i:i + 1000]

        r = httpx.post(f"{s.url}/v1/score", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and error_of(r)["type"] == "request_too_large"
        ok = httpx.post(f"{s.url}/v1/score", json={"pack": "spam", "messages": [{"text": "small"}]})
        assert ok.status_code == 200


def test_api_keys_are_required_when_configured():
    with serving(api_keys=["k1-secret", "k2-secret"]) as s:
        body = {"pack": "spam", "messages": [{"text": "x"}]}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k1-secret"}, {"Authorization": "Basic k1-secret"}):
            r = httpx.post(f"{s.url}/v1/score", json=body, headers=headers)
            assert r.status_code == 401, headers
            assert error_of(r)["type"] == "authentication_error" and r.headers["www-authenticate"] == "Bearer"
        for key in ("k1-secret", "k2-secret"):
            assert httpx.post(f"{s.url}/v1/score", json=body, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(f"{s.url}/v1/packs").status_code == 401
        assert httpx.get(f"{s.url}/v1/models", headers={"Authorization": "Bearer k2-secret"}).status_code == 200


def test_a_full_queue_is_a_429_with_retry_after_not_a_hang():
    slow = fake(delay_s=1.0)
    with serving({"auto": slow}, max_queued=4) as s:
        def body(tag: str, n: int) -> dict[str, Any]:
            return {"pack": "spam", "messages": [{"text": f"{tag}{i}"} for i in range(n)]}

        async def go() -> tuple[httpx.Response, ...]:
            async with httpx.AsyncClient(timeout=30) as c:
                running = asyncio.create_task(c.post(f"{s.url}/v1/score", json=body("a", 3)))
                await asyncio.sleep(0.3)  # its batch is on the engine
                queued = asyncio.create_task(c.post(f"{s.url}/v1/score", json=body("b", 3)))
                await asyncio.sleep(0.2)  # 3 queued of 4
                t0 = time.monotonic()
                refused = await c.post(f"{s.url}/v1/score", json=body("c", 2))
                assert time.monotonic() - t0 < 0.5  # answered at once
                return await running, await queued, refused
        running, queued, refused = asyncio.run(go())
    assert running.status_code == 200 and queued.status_code == 200
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert error_of(refused)["type"] == "rate_limit_error"


def test_a_request_over_the_timeout_is_a_504_and_its_queued_messages_leave_the_queue():
    slow = fake(delay_s=0.5)
    with serving({"auto": slow}, timeout_s=0.2, window_s=0.0) as s:
        r = httpx.post(f"{s.url}/v1/score", json={"pack": "spam", "messages": [{"text": "a"}]})
        assert r.status_code == 504 and error_of(r)["type"] == "timeout_error"
        time.sleep(0.6)
        assert len(s.scoring._scheduler) == 0 and s.scoring._queued == 0


def test_packs_and_models_list_what_is_served():
    with serving() as s:
        packs = httpx.get(f"{s.url}/v1/packs").json()
        models = httpx.get(f"{s.url}/v1/models").json()
    assert packs["object"] == "list" and [p["name"] for p in packs["data"]] == ["spam"]
    (entry,) = packs["data"]
    assert entry["version"] == SPAM.version and entry["fields"] == list(SPAM.fields)
    assert [q["id"] for q in entry["questions"]] == [q.id for q in SPAM.expand()]
    assert all(q["choices"] == list(e.choices) for q, e in zip(entry["questions"], SPAM.expand()))
    assert models == {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "spinf-stream",
                                                   "loaded": True, "sha256": None}]}


def test_the_checked_in_openapi_document_is_the_one_served():
    from spinf_stream.api.app import openapi_document

    with serving() as s:
        served = httpx.get(f"{s.url}/openapi.json").json()
    assert served == openapi_document()
    assert orjson.loads((REPO / "schemas" / "openapi.json").read_bytes()) == served, "run `make schemas`"


# -- spinf-stream serve on a tiny model ----------------------------------------------------------


def wait_for_api(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> str:
    """The API's base URL once ``proc`` answers ``GET /v1/models`` on ``port`` (its log on failure)."""
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def served_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    with open(log, "wb") as out:
        proc = subprocess.Popen([*CLI, "serve", "--model", str(tiny_model), "--pack", "spam", "--token-budget", "512",
                                 "--api-port", str(port), "--device", "cpu", "--dtype", "float32"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = wait_for_api(port, proc, log)
    yield url
    proc.terminate()
    assert proc.wait(30) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "loopback only" in text  # no key: the warning


def test_serve_records_equal_offline_scoring_for_each_calibration(served_model, tiny_model):
    from spinf_stream.engine import Engine, Message
    from broker import real_messages

    msgs = [{"id": m["id"], "text": m["text"]} for m in real_messages("sms_spam", 12)]
    for cal in ("auto", "none"):
        r = httpx.post(f"{served_model}/v1/score", json={"pack": "spam", "messages": msgs, "calibration": cal}, timeout=60)
        assert r.status_code == 200, r.text
        engine = Engine.load(model=str(tiny_model), pack="spam", token_budget=512, calibration=cal)
        want = [rec.model_dump(mode="json") for rec in engine.score([Message(id=m["id"], fields=m) for m in msgs])]
        assert r.json()["records"] == want, cal
        assert r.json()["usage"]["prompt_tokens"] > r.json()["usage"]["computed_tokens"] > 0  # the preamble is read once


def test_serve_answers_sglang_vllm_and_openai_shapes_as_the_engine_reads(served_model, tiny_model):
    """The model-level reads through ``spinf-stream serve``: equal to :mod:`spinf_stream.engine.reads`
    run in this process on the same weights (bit for bit: same back end, same tree)."""
    import openai
    from transformers import AutoTokenizer

    from spinf_stream.engine.reads import LabelRequest, label_logprobs, prompt_logprobs
    from spinf_stream.models import load_decoder

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    decoder = load_decoder(tiny_model)
    query, items = "Is this spam? ", ["Win a prize now", "lunch at noon?"]
    labels = [tok(" yes", add_special_tokens=False).input_ids[0], tok(" no", add_special_tokens=False).input_ids[0]]
    r = httpx.post(f"{served_model}/v1/score", json={"query": query, "items": items, "label_token_ids": labels}, timeout=60)
    assert r.status_code == 200, r.text
    (want,) = label_logprobs(decoder, [LabelRequest(tuple(tuple(tok(query + i).input_ids) for i in items), tuple(labels))], 512)
    assert r.json()["scores"] == [[math.exp(x) for x in per] for per in want]
    v = httpx.post(f"{served_model}/v1/generative-scores", json={"query": query, "items": items, "label_token_ids": labels,
                                                                  "apply_softmax": False}, timeout=60)
    assert [[x["token_probs"][str(t)] for t in labels] for x in v.json()["results"]] == r.json()["scores"]
    client = openai.OpenAI(base_url=f"{served_model}/v1", api_key="unused")
    got = client.completions.create(model=r.json()["model"], prompt=query + items[0], echo=True, max_tokens=0, logprobs=1)
    (read,) = prompt_logprobs(decoder, [tok(query + items[0]).input_ids], 1, 512)
    assert got.choices[0].logprobs.token_logprobs == list(read.token_logprobs)


def test_serve_lists_its_pack_and_model_and_binds_loopback_without_a_key(served_model):
    packs = httpx.get(f"{served_model}/v1/packs").json()["data"]
    assert packs[0]["name"] == "spam" and packs[0]["questions"][0]["choices"]
    assert httpx.get(f"{served_model}/v1/models").json()["data"][0]["loaded"] is True
    port = int(served_model.rsplit(":", 1)[1])
    addrs = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1", "127.0.1.1"}
    for addr in addrs:  # another interface of this machine does not reach it
        with pytest.raises(OSError):
            socket.create_connection((addr, port), timeout=1).close()


def test_the_readme_curl_example_runs_against_serve(served_model):
    import re
    import shutil

    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    text = (REPO / "README.md").read_text()
    (block,) = re.findall(r"<!-- api-example -->\n```bash\n(.*?)```", text, flags=re.S)
    command = block.split("&\n", 1)[1].replace("localhost:8000", served_model.removeprefix("http://"))
    out = subprocess.run(["bash", "-c", command], capture_output=True, timeout=60, env={"PATH": os.path.dirname(curl)})
    assert out.returncode == 0, out.stderr
    records = orjson.loads(out.stdout)["records"]
    assert [r["id"] for r in records] == ["m1", "m2"] and all(r["digest"].startswith("sha256:") for r in records)


def test_the_readme_sglang_and_openai_sdk_examples_run_against_serve(served_model, tmp_path):
    import re
    import shutil
    import sys

    text = (REPO / "README.md").read_text()
    (sglang,) = re.findall(r"<!-- api-sglang-example -->\n```bash\n(.*?)```", text, flags=re.S)
    (sdk,) = re.findall(r"<!-- api-openai-example -->\n```python\n(.*?)```", text, flags=re.S)
    model = httpx.get(f"{served_model}/v1/models").json()["data"][0]["id"]
    curl = shutil.which("curl")
    if curl is not None:
        out = subprocess.run(["bash", "-c", sglang.replace("localhost:8000", served_model.removeprefix("http://"))],
                             capture_output=True, timeout=60, env={"PATH": os.path.dirname(curl)})
        assert out.returncode == 0, out.stderr
        scores = orjson.loads(out.stdout)["scores"]
        assert len(scores) == 2 and all(sum(s) == pytest.approx(1.0) for s in scores)
    script = tmp_path / "example.py"
    script.write_text(sdk.replace("http://localhost:8000", served_model).replace('"qwen2.5-coder-0.5b"', repr(model)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=60, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.rsplit(" ", 1)[0] for line in lines] == ["' yes'", "' no'"]
    assert all(float(line.rsplit(" ", 1)[1]) < 0 for line in lines)


# -- the API beside the stream: spinf-stream run ---------------------------------------------------


def test_run_serves_the_api_and_its_records_equal_the_topic_s(topics, tiny_model, tmp_path):
    """``run --api-port P``: the same messages produced to the input topic and posted to
    /v1/score get records with equal scores and digests; the stream keeps scoring meanwhile."""
    from broker import json_line, produce, read_all, real_messages, run_settings, start_scorer_process

    t = topics(1)
    msgs = [{"id": m["id"], "text": m["text"]} for m in real_messages("sms_spam", 16)]
    port = free_port()
    settings = run_settings(t, model=str(tiny_model), pack="spam", token_budget=512, api_port=port)
    log = tmp_path / "run.log"
    proc = start_scorer_process(settings, log)
    try:
        url = wait_for_api(port, proc, log)
        produce(t, [json_line(m) for m in msgs[:8]])
        r = httpx.post(f"{url}/v1/score", json={"pack": "spam", "messages": msgs}, timeout=60)
        produce(t, [json_line(m) for m in msgs[8:]])
        assert r.status_code == 200, r.text
        api = {rec["id"]: rec for rec in r.json()["records"]}
        topic = {orjson.loads(x.value)["id"]: orjson.loads(x.value) for x in read_all(t, [t.output], n=16)}
        assert set(api) == set(topic) == {m["id"] for m in msgs}
        for mid, rec in api.items():
            assert {k: v for k, v in topic[mid].items() if k != "source"} == rec, mid
        models = httpx.get(f"{url}/v1/models").json()["data"]
        assert [m["id"] for m in models] == [api[msgs[0]["id"]]["model"]["name"]] and models[0]["loaded"]
        items = httpx.post(f"{url}/v1/score", json={"query": "Spam? ", "items": ["a", "b"], "label_token_ids": [1, 2]}, timeout=60)
        echo = httpx.post(f"{url}/v1/completions", json={"prompt": ["Spam? a", "Spam? b"], "echo": True, "max_tokens": 0,
                                                        "logprobs": 0}, timeout=60)
        assert items.status_code == echo.status_code == 200, (items.text, echo.text)
        assert len(items.json()["scores"]) == 2 and len(echo.json()["choices"]) == 2
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    assert "HTTP API on http://127.0.0.1:" in log.read_text()


def test_slow_and_partial_requests_do_not_stall_the_stream(topics, tiny_model, tmp_path):
    """A slowloris attack of bounded length on ``run``'s API (200 connections trickling partial
    headers and bodies): records produced meanwhile are scored, and a whole request is answered."""
    from broker import json_line, produce, read_all, real_messages, run_settings, start_scorer_process

    t = topics(1)
    msgs = [{"id": m["id"], "text": m["text"]} for m in real_messages("sms_spam", 8)]
    port = free_port()
    log = tmp_path / "run.log"
    proc = start_scorer_process(run_settings(t, model=str(tiny_model), pack="spam", token_budget=512, api_port=port), log)
    socks: list[socket.socket] = []
    try:
        url = wait_for_api(port, proc, log)
        for i in range(200):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            head = b"POST /v1/score HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"POST /v1/score HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{"
            s.sendall(head)
            socks.append(s)
        started = time.monotonic()
        produce(t, [json_line(m) for m in msgs])
        stop = threading.Event()

        def trickle() -> None:  # one more byte on every connection every 0.5 s, for as long as the test reads
            while not stop.wait(0.5):
                for s in socks:
                    try:
                        s.sendall(b"X")
                    except OSError:
                        pass

        threading.Thread(target=trickle, daemon=True).start()
        try:
            got = read_all(t, [t.output], n=len(msgs))
            r = httpx.post(f"{url}/v1/score", json={"pack": "spam", "messages": msgs[:1]}, timeout=60)
        finally:
            stop.set()
        assert {orjson.loads(x.value)["id"] for x in got} == {m["id"] for m in msgs}
        assert r.status_code == 200, r.text
        assert time.monotonic() - started < 60
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        assert proc.wait(60) == 0, log.read_text()[-3000:]
