"""The HTTP API fuzzed from its own OpenAPI document (schemathesis): no body, valid or not, gets a
5xx, on a real engine (a tiny random-weight model with the spam pack) over a real port."""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from test_api import serving

from spinf_stream.engine import Engine
from spinf_stream.packs import load_pack


@pytest.fixture(scope="module")
def api_schema(tiny_models, loaded):
    decoder, tok = loaded(tiny_models("llama"))
    with serving({"auto": Engine(decoder, tok, load_pack("spam"), "llama")}, max_messages=8) as s:
        yield schemathesis.openapi.from_url(f"{s.url}/openapi.json")


def test_no_request_gets_a_server_error(api_schema):
    seen = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        seen.append(f"{operation.method.upper()} {operation.path}")

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(max_examples=100, deadline=None, suppress_health_check=list(hypothesis.HealthCheck),
                             phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate], database=None)
        def check(case):
            response = case.call(timeout=60)
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
            if response.status_code >= 400:
                error = response.json()["error"]
                assert set(error) == {"type", "message", "param"} and error["message"]

        check()
    assert {"POST /v1/score", "POST /v1/completions", "POST /v1/generative-scores", "GET /v1/models"} <= set(seen)
