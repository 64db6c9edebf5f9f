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


def test_the_message_schema_describes_picture_and_video_fields():
    import jsonschema

    from spinf_stream.images import is_picture_value
    from spinf_stream.input_schema import input_schemas

    schema = input_schemas()["message.schema.json"]
    field = jsonschema.Draft202012Validator({**schema["$defs"]["FieldValue"], "$defs": schema["$defs"]})
    good = ["text", "data:image/png;base64,AAAA", {"image": "AAAA"}, {"video": "AAAA"}, {"video": "AAAA", "fps": 2.5},
            [{"image": "AAAA"}, {"image": "BBBB"}]]
    bad = [{"image": 1}, {"image": "A", "x": 1}, {"video": "A", "fps": 0}, [{"video": "A"}], 3]
    assert all(field.is_valid(v) for v in good)
    assert not any(field.is_valid(v) for v in bad)
    assert [is_picture_value(v) for v in good] == [False, True, True, True, True, True]
