"""The committed ``schemas/`` are exactly what the pydantic models generate."""

from __future__ import annotations

from conftest import REPO

from spinf_stream.schemas import all_schemas, render


def test_committed_schemas_match_the_models():
    for name, schema in all_schemas().items():
        path = REPO / "schemas" / name
        assert path.exists(), f"{path} missing: run python -m spinf_stream.schemas"
        assert path.read_text(encoding="utf-8") == render(schema), f"{name} is stale: run python -m spinf_stream.schemas"


def test_score_schema_requires_the_record_fields():
    score = all_schemas()["score.schema.json"]
    assert set(score["required"]) == {"id", "pack", "model", "scores", "digest"}
