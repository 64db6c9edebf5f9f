"""Reads by a model over HTTP (a real port, httpx and the OpenAI Python SDK): SGLang's
``/v1/score`` (query, items, label_token_ids), vLLM's ``/v1/generative-scores`` and OpenAI's
``/v1/completions`` with echo and logprobs, for every family on tiny random-weight models,
against transformers run on each prompt alone (fp32, eager attention)."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
import torch
from oracle import greedy_writing, load_hf, next_logprobs
from test_api import error_of, serving

from spinf_stream.engine import Engine
from spinf_stream.packs import load_pack
from tiny import FAMILIES

QUERY = "Is the following message spam? Reply yes or no.\nMessage: "
ITEMS = ["WINNER!! Claim your prize now, call 0800 123", "see you at lunch tomorrow?", "ok"]


def oracle_scores(model: Any, tok: Any, query: str, items: list[str], labels: list[int], softmax: bool, item_first: bool) -> list[list[float]]:
    """SGLang's definition: the label tokens' next-token probabilities after the whole prompt."""
    out = []
    for item in items:
        lp = next_logprobs(model, tok(item + query if item_first else query + item).input_ids)[-1]
        picked = lp[labels]
        out.append((torch.softmax(picked, 0) if softmax else picked.exp()).tolist())
    return out


@pytest.fixture(scope="module")
def family_api(tiny_models, loaded):
    """``family -> (base url, tokenizer, transformers model)``: the API on a real engine of each tiny model."""
    opened: dict[str, Any] = {}
    stack = []

    def get(family: str):
        if family not in opened:
            path = tiny_models(family)
            decoder, tok = loaded(path)
            cm = serving({"auto": Engine(decoder, tok, load_pack("spam"), family)})
            served = cm.__enter__()
            stack.append(cm)
            opened[family] = (served.url, tok, load_hf(str(path)))
        return opened[family]

    yield get
    for cm in stack:
        cm.__exit__(None, None, None)


@pytest.mark.parametrize("family", FAMILIES)
def test_sglang_scores_equal_transformers(family_api, family):
    url, tok, model = family_api(family)
    labels = [tok(" yes", add_special_tokens=False).input_ids[0], tok(" no", add_special_tokens=False).input_ids[0]]
    for softmax, item_first in ((False, False), (True, False), (False, True)):
        body = {"query": QUERY, "items": ITEMS, "label_token_ids": labels, "apply_softmax": softmax, "item_first": item_first}
        r = httpx.post(f"{url}/v1/score", json=body, timeout=60)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["object"] == "scoring" and got["model"] == family
        want = oracle_scores(model, tok, QUERY, ITEMS, labels, softmax, item_first)
        for g, w in zip(got["scores"], want, strict=True):
            assert g == pytest.approx(w, abs=2e-5)
        if softmax:
            assert all(math.fsum(s) == pytest.approx(1.0) for s in got["scores"])
        n = sum(len(tok(QUERY + i if not item_first else i + QUERY).input_ids) for i in ITEMS)
        assert got["usage"] == {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n}


@pytest.mark.parametrize("family", FAMILIES)
def test_completions_echo_logprobs_equal_transformers_through_the_openai_sdk(family_api, family):
    import openai

    url, tok, model = family_api(family)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    prompts = [QUERY + item for item in ITEMS]
    got = client.completions.create(model=family, prompt=prompts, echo=True, max_tokens=0, logprobs=3, temperature=0)
    assert got.object == "text_completion" and len(got.choices) == len(prompts)
    for prompt, choice in zip(prompts, got.choices):
        ids = tok(prompt).input_ids
        lp = next_logprobs(model, ids)
        assert choice.text == prompt and choice.finish_reason == "length"
        assert choice.logprobs.token_logprobs[0] is None
        assert choice.logprobs.token_logprobs[1:] == pytest.approx([float(lp[i - 1, ids[i]]) for i in range(1, len(ids))], abs=1e-4)
        assert choice.logprobs.tokens == [tok.decode([t]) for t in ids]
        assert choice.logprobs.text_offset[0] == 0 and choice.logprobs.text_offset == sorted(choice.logprobs.text_offset)
        top = choice.logprobs.top_logprobs
        assert top[0] is None and 3 <= len(top[1]) <= 4  # the top 3 and the chosen token
        assert max(top[1].values()) == pytest.approx(float(lp[0].max()), abs=1e-4)
    assert got.usage.prompt_tokens == sum(len(tok(p).input_ids) for p in prompts) and got.usage.completion_tokens == 0
    one = client.completions.create(model=family, prompt=prompts[0], max_tokens=1, temperature=0, logprobs=0)
    ids = tok(prompts[0]).input_ids
    lp = next_logprobs(model, ids)[-1]
    greedy = int(torch.argmax(lp))
    assert one.choices[0].text == tok.decode([greedy]) and one.usage.completion_tokens == 1
    assert one.choices[0].logprobs.token_logprobs == pytest.approx([float(lp[greedy])], abs=1e-4)
    # greedy writing of several tokens, every prompt of the request, with echo: transformers' own
    many = client.completions.create(model=family, prompt=prompts, max_tokens=6, temperature=0, logprobs=2, echo=True)
    written = 0
    for prompt, choice in zip(prompts, many.choices):
        ids = tok(prompt).input_ids
        want, want_lps = greedy_writing(model, ids, 6, tok.eos_token_id)
        written += len(want)
        assert choice.text == prompt + tok.decode(want)
        assert choice.finish_reason == ("length" if len(want) == 6 else "stop")
        assert choice.logprobs.tokens == [tok.decode([t]) for t in ids + want]
        assert choice.logprobs.token_logprobs[len(ids):] == pytest.approx(want_lps, abs=1e-4)
        for at, top in enumerate(choice.logprobs.top_logprobs[len(ids):]):
            lp = next_logprobs(model, ids + want[:at])[-1]
            assert max(top.values()) == pytest.approx(float(lp.max()), abs=1e-4) and 2 <= len(top) <= 3
    assert many.usage.completion_tokens == written


def test_vllm_generative_scores_and_token_id_inputs(family_api):
    url, tok, model = family_api("qwen2")
    labels = [tok(w, add_special_tokens=False).input_ids[0] for w in (" yes", " no", " maybe")]
    q = tok(QUERY, add_special_tokens=False).input_ids
    items = [tok(i, add_special_tokens=False).input_ids for i in ITEMS]
    r = httpx.post(f"{url}/v1/generative-scores", json={"query": q, "items": items, "label_token_ids": labels}, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "generative_score" and [x["index"] for x in got["results"]] == [0, 1, 2]
    for res, item in zip(got["results"], items):
        lp = next_logprobs(model, q + item)[-1][labels]
        want = torch.softmax(lp, 0).tolist()  # vLLM's default: softmax over the labels
        assert [res["token_probs"][str(t)] for t in labels] == pytest.approx(want, abs=2e-5)
    same = httpx.post(f"{url}/generative_scoring", json={"query": q, "items": items, "label_token_ids": labels}, timeout=60)
    assert [x["token_probs"] for x in same.json()["results"]] == [x["token_probs"] for x in got["results"]]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/score", {"query": "q", "items": [[1, 2]], "label_token_ids": [1]}, "items"),
    ("/v1/score", {"query": "q", "items": [], "label_token_ids": [1]}, "items"),
    ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": [10**9]}, "label_token_ids"),
    ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": []}, "label_token_ids"),
    ("/v1/score", {"query": [1], "items": [[2**40]], "label_token_ids": [1]}, "items"),
    ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": [1], "model": "nope"}, "model"),
    ("/v1/generative-scores", {"query": "q", "items": ["a"], "label_token_ids": [1], "temperature": 0.7}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "temperature": 1}, "temperature"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 257}, "max_tokens"),
    ("/v1/completions", {"prompt": ["ok", "abc\udfff"], "max_tokens": 1}, None),
    ("/v1/score", {"query": "Is \ud800 spam?", "items": ["a"], "label_token_ids": [1]}, None),
    ("/v1/score", {"pack": "spam", "messages": [{"text": "hi \ud800"}]}, None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/completions", {"prompt": ["hi", "x " * 1900], "max_tokens": 200}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0, "stream": True}, "stream"),
    ("/v1/completions", {"prompt": [], "max_tokens": 0}, "prompt"),
    ("/v1/completions", {"prompt": "x " * 5000, "max_tokens": 0}, "prompt"),
])
def test_bad_reads_get_a_400_or_404_naming_the_parameter(family_api, path, body, param):
    url, _, _ = family_api("llama")
    r = httpx.post(f"{url}{path}", content=json.dumps(body), headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == (404 if param == "model" else 400), r.text
    assert error_of(r)["param"] == param, r.text
    if param is None:  # a lone surrogate: valid JSON, not Unicode text
        assert "lone surrogate" in error_of(r)["message"], r.text


@pytest.mark.real_model
def test_sglang_scores_equal_transformers_on_a_real_model(loaded):
    from spinf_stream.models.resolve import resolve

    path = resolve("smollm2-135m").path
    decoder, tok = loaded(path)
    model = load_hf(str(path))
    labels = [tok(w, add_special_tokens=False).input_ids[0] for w in (" yes", " no")]
    with serving({"auto": Engine(decoder, tok, load_pack("spam"), "smollm2-135m")}) as s:
        r = httpx.post(f"{s.url}/v1/score", json={"query": QUERY, "items": ITEMS, "label_token_ids": labels}, timeout=120)
    assert r.status_code == 200, r.text
    want = oracle_scores(model, tok, QUERY, ITEMS, labels, False, False)
    for g, w in zip(r.json()["scores"], want, strict=True):
        assert g == pytest.approx(w, abs=2e-5, rel=1e-4)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from spinf_stream.models.resolve import resolve

    return AutoTokenizer.from_pretrained(str(resolve("smollm2-135m").path))


def _written(tok: Any, text: str, finish: str = "length") -> Any:
    """A written completion of ``text``'s tokens, each of logprob -0.25 with itself as the top-1."""
    from spinf_stream.engine.reads import Completion

    ids = tuple(tok(text, add_special_tokens=False).input_ids)
    return Completion(ids, (-0.25,) * len(ids), tuple(((t, -0.25),) for t in ids), text, finish)  # type: ignore[arg-type]


def test_a_choice_shows_the_written_text_its_tokens_and_the_echoed_prompt(smollm2_tokenizer):
    """OpenAI's layout of a choice: the written text (after the echoed prompt), its tokens each
    decoded alone with their offsets in the returned text, and the completion's finish reason."""
    from spinf_stream.api.bodies import CompletionRequest
    from spinf_stream.api.completions import _choice
    from spinf_stream.engine.reads import PromptLogprobs

    tok = smollm2_tokenizer
    prompt = tok("The answer is").input_ids
    body = CompletionRequest(prompt="The answer is", max_tokens=4, logprobs=1, echo=False)
    plain = _choice(tok, 0, "The answer is", prompt, None, _written(tok, " yes it is"), body)
    pieces = [tok.decode([t]) for t in tok(" yes it is", add_special_tokens=False).input_ids]
    assert (plain.text, plain.finish_reason) == (" yes it is", "length")
    assert plain.logprobs.tokens == pieces and plain.logprobs.token_logprobs == [-0.25] * len(pieces)
    assert plain.logprobs.text_offset == [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    stopped = _choice(tok, 0, "The answer is", prompt, None, _written(tok, "", "stop"), body)
    assert (stopped.text, stopped.finish_reason, stopped.logprobs.tokens) == ("", "stop", [])
    read = PromptLogprobs(tuple(prompt), (None,) + (-1.0,) * (len(prompt) - 1),
                          (None,) + (((prompt[0], -0.5),),) * (len(prompt) - 1), (), prompt[0], -0.5)
    echoed = _choice(tok, 0, "The answer is", prompt, read, _written(tok, " yes"), body.model_copy(update={"echo": True}))
    assert echoed.text == "The answer is yes" and echoed.logprobs.token_logprobs[0] is None
    assert echoed.logprobs.text_offset[-1] == len("The answer is")
    assert len(echoed.logprobs.tokens) == len(prompt) + 1


INLINE = """\
name: drafting
version: "0.1.0"
description: a pack being written
prompt: "Review: {text}\\n"
question: "Question: {question}\\nAnswer:"
choices: [yes, no]
questions:
  - id: positive
    text: Is the review positive?
  - id: mentions_price
    text: Does it mention the price?
"""


def test_an_inline_pack_is_scored_as_the_same_pack_loaded_offline(tiny_models, loaded, tmp_path):
    import yaml

    from spinf_stream.engine import Message
    from spinf_stream.packs.load import parse_pack

    decoder, tok = loaded(tiny_models("llama"))
    msgs = [{"id": "r1", "text": "Great value for the price."}, {"id": "r2", "text": "Broke after a day."}]
    want = Engine(decoder, tok, parse_pack(INLINE), "llama").score([Message(id=m["id"], fields=m) for m in msgs])
    with serving({"auto": Engine(decoder, tok, load_pack("spam"), "llama")}) as s:
        body = {"pack": yaml.load(INLINE, Loader=yaml.BaseLoader), "messages": msgs}
        first = httpx.post(f"{s.url}/v1/score", json=body, timeout=120)
        again = httpx.post(f"{s.url}/v1/score", json=body, timeout=120)
        assert first.status_code == again.status_code == 200, first.text
        assert first.json()["records"] == again.json()["records"] == [r.model_dump(mode="json") for r in want]
        assert len([k for k in s.scoring.lanes if k.startswith("inline|")]) == 1  # built once
        assert [p["name"] for p in httpx.get(f"{s.url}/v1/packs").json()["data"]] == ["spam"]
        bad = httpx.post(f"{s.url}/v1/score", json={"pack": {**yaml.load(INLINE, Loader=yaml.BaseLoader), "choices": "yes"}, "messages": msgs})
        assert bad.status_code == 400 and error_of(bad)["param"] == "pack" and "choices" in error_of(bad)["message"]
        cal = httpx.post(f"{s.url}/v1/score", json={**body, "calibration": "auto"})
        assert cal.status_code == 400 and error_of(cal)["param"] == "calibration"
    with serving({"auto": Engine(decoder, tok, load_pack("spam"), "llama")}, inline_packs=False) as s:
        off = httpx.post(f"{s.url}/v1/score", json={"pack": yaml.load(INLINE, Loader=yaml.BaseLoader), "messages": msgs})
        assert off.status_code == 400 and "--no-api-inline-packs" in error_of(off)["message"]


def test_a_long_read_runs_in_steps_with_other_engine_work_between_them():
    """A read given as a generator runs a step per engine call: work submitted while it runs (a
    stream batch, another request) runs before its last step, not after it; a read cancelled
    mid-way runs no further step and its generator is closed."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from spinf_stream.api.reads import ModelReads
    from spinf_stream.api.scoring import Lane
    from spinf_stream.stream.engine_thread import EngineThread

    log: list[str] = []
    first = threading.Event()
    closed = threading.Event()

    def long_read(decoder: Any, n: int) -> Any:
        try:
            for i in range(n):
                log.append(f"step {i}")
                first.set()
                yield
            return "done"
        finally:
            closed.set()

    scorer = SimpleNamespace(loaded_decoder=lambda: None, model_info=SimpleNamespace(name="m"))
    lane = Lane("spam|auto", "spam", "1", "auto", scorer)  # type: ignore[arg-type]

    async def main() -> None:
        with EngineThread() as engine:
            reads = ModelReads([lane], engine, token_budget=64)
            task = asyncio.create_task(reads.run(lane, 1, long_read, 200))
            await asyncio.to_thread(first.wait, 10)
            await engine.run(log.append, "other")
            assert await task == "done" and closed.is_set()
            assert log.index("other") < log.index("step 199") and len(log) == 201
            log.clear()
            first.clear()
            closed.clear()
            task = asyncio.create_task(reads.run(lane, 1, long_read, 10**6))
            await asyncio.to_thread(first.wait, 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(closed.wait, 10)
            ran = len(log)
            await engine.run(lambda: None)
            assert closed.is_set() and len(log) == ran < 10**6 and reads._queued == 0

    asyncio.run(main())


def test_a_completion_whose_client_disconnects_runs_no_further_step(family_api, monkeypatch):
    """A client that closes its connection mid-completion: its engine steps stop within a poll,
    not at the end of its ``max_tokens``; the server answers the next request as usual."""
    import socket
    import threading
    import time

    from spinf_stream.api import reads

    url, _, _ = family_api("llama")
    steps = []
    real_step = reads._Call.step

    def slow_step(self: Any) -> Any:  # 20 ms a step: 256 steps would take over 5 s
        steps.append(threading.get_ident())
        time.sleep(0.02)
        return real_step(self)

    monkeypatch.setattr(reads._Call, "step", slow_step)
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": ["one two", "one three"], "max_tokens": 256}).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 30
        while len(steps) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(steps) >= 5
    time.sleep(1.0)
    ran = len(steps)
    time.sleep(1.0)
    assert len(steps) == ran < 150, f"{ran} steps, then {len(steps)}: the completion went on without its client"
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
