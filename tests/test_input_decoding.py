"""The offline command and the service read input through one decoder: the same bytes are
accepted or rejected alike, with the same error kind.

Each row's expected outcome comes from the definitions, not from our code: RFC 8259 (JSON: no
NaN/Infinity, no raw control characters in strings, escapes must form valid UTF-16, one value
per document), RFC 3629 / Unicode table 3-7 (well-formed UTF-8: no overlong forms, no encoded
surrogates, nothing above U+10FFFF), and the product's rules (one leading byte order mark is
dropped; the top level is an object; ``id`` is a non-empty string or an integer, or absent/null).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from spinf_stream.messages import Decoded as LineDecoded
from spinf_stream.cli.offline import parse_line, score_file
from spinf_stream.stream.codec import Decoded, Rejection, decode_value
from broker import FakeScorer, RunningService, fake_message, produce, read_all, run_settings, tansu, topics, wait_for  # noqa: F401
from fakes import SlowEngine

BOM = b"\xef\xbb\xbf"
OK = "ok"

#: (name, bytes of one line / one record value, expected kind or OK, expected id when OK and given)
TABLE: list[tuple[str, bytes, str, str | None]] = [
    ("plain object", b'{"id": "a1", "text": "hello"}', OK, "a1"),
    ("leading BOM", BOM + b'{"id": "a2", "text": "hello"}', OK, "a2"),
    ("BOM alone", BOM, "empty_value", None),
    ("two BOMs", BOM + BOM + b'{"id": "a3", "text": "x"}', "invalid_json", None),
    ("BOM after a space", b" " + BOM + b'{"id": "a4", "text": "x"}', "invalid_json", None),
    ("BOM inside a string", b'{"id": "a5", "text": "x' + BOM + b'y"}', OK, "a5"),
    ("empty line", b"", "empty_value", None),
    ("blank line of spaces", b"   ", "invalid_json", None),
    ("trailing CR of a CRLF line", b'{"id": "a6", "text": "x"}\r', OK, "a6"),
    ("raw NUL in a string", b'{"id": "a7", "text": "x\x00y"}', "invalid_json", None),
    ("escaped NUL", b'{"id": "a8", "text": "x\\u0000y"}', OK, "a8"),
    ("NUL alone", b"\x00", "invalid_json", None),
    ("raw tab in a string", b'{"id": "a9", "text": "x\ty"}', "invalid_json", None),
    ("lone high surrogate escape", b'{"id": "b1", "text": "\\ud800"}', "invalid_json", None),
    ("lone low surrogate escape", b'{"id": "b2", "text": "\\udc00"}', "invalid_json", None),
    ("surrogate pair escape", b'{"id": "b3", "text": "\\ud83d\\ude00"}', OK, "b3"),
    ("raw U+2028 in a string", '{"id": "b4", "text": "a\u2028b"}'.encode(), OK, "b4"),
    ("invalid UTF-8 byte", b'{"id": "b5", "text": "\xff"}', "invalid_utf8", None),
    ("UTF-16 BOM", b"\xff\xfe{\x00}\x00", "invalid_utf8", None),
    ("overlong '/'", b'{"id": "b6", "text": "\xc0\xaf"}', "invalid_utf8", None),
    ("overlong NUL", b'{"id": "b7", "text": "\xc0\x80"}', "invalid_utf8", None),
    ("UTF-8 encoded surrogate", b'{"id": "b8", "text": "\xed\xa0\x80"}', "invalid_utf8", None),
    ("truncated sequence", b'{"id": "b9", "text": "\xe2\x82"}', "invalid_utf8", None),
    ("above U+10FFFF", b'{"id": "c1", "text": "\xf4\x90\x80\x80"}', "invalid_utf8", None),
    ("top-level array", b'["a", "list"]', "not_an_object", None),
    ("top-level string", b'"a string"', "not_an_object", None),
    ("top-level number", b"42", "not_an_object", None),
    ("top-level null", b"null", "not_an_object", None),
    ("top-level true", b"true", "not_an_object", None),
    ("duplicate key: the last wins", b'{"id": "c2", "text": "first", "text": "second"}', OK, "c2"),
    ("duplicate id: the last wins", b'{"id": "c3", "id": "c4", "text": "x"}', OK, "c4"),
    ("id an integer", b'{"id": 7, "text": "x"}', OK, "7"),
    ("id a negative integer", b'{"id": -5, "text": "x"}', OK, "-5"),
    ("id the largest 64-bit unsigned", b'{"id": 18446744073709551615, "text": "x"}', OK, "18446744073709551615"),
    ("id past 64 bits (parsed as a float)", b'{"id": 123456789012345678901234567890, "text": "x"}', "wrong_type", None),
    ("id a float", b'{"id": 1.5, "text": "x"}', "wrong_type", None),
    ("id a whole float", b'{"id": 1.0, "text": "x"}', "wrong_type", None),
    ("id a boolean", b'{"id": true, "text": "x"}', "wrong_type", None),
    ("id an object", b'{"id": {"a": 1}, "text": "x"}', "wrong_type", None),
    ("id null: the default id", b'{"id": null, "text": "x"}', OK, None),
    ("no id: the default id", b'{"text": "x"}', OK, None),
    ("id empty", b'{"id": "", "text": "x"}', "empty_field", None),
    ("id blank", b'{"id": "  ", "text": "x"}', "empty_field", None),
    ("nested fields", b'{"id": "c5", "text": "x", "meta": {"a": [1, {"b": null}]}}', OK, "c5"),
    ("NaN literal", b'{"id": "c6", "text": "x", "s": NaN}', "invalid_json", None),
    ("Infinity literal", b'{"id": "c7", "text": "x", "s": Infinity}', "invalid_json", None),
    ("number overflowing a double", b'{"id": "c8", "text": "x", "s": 1e400}', "invalid_json", None),
    ("nesting 2000 deep", b"[" * 2000 + b"]" * 2000, "invalid_json", None),
    ("trailing comma", b'{"id": "c9", "text": "x",}', "invalid_json", None),
    ("single quotes", b"{'id': 'd1', 'text': 'x'}", "invalid_json", None),
    ("content after the object", b'{"id": "d2", "text": "x"} tail', "invalid_json", None),
    ("two objects on one line", b'{"id": "d3", "text": "x"}{"id": "d4", "text": "y"}', "invalid_json", None),
]
IDS = [row[0] for row in TABLE]


def _stream(value: bytes, fmt: str = "json") -> Decoded | Rejection:
    return decode_value(value, topic="in", partition=0, offset=9, input_format=fmt)  # type: ignore[arg-type]


def _offline(line: bytes, fmt: str = "json") -> Any:
    return parse_line(line, 1, source="f.jsonl", input_format=fmt)  # type: ignore[arg-type]


def _outcome(got: Any) -> str:
    if isinstance(got, (Decoded, LineDecoded)):
        return OK
    return got.kind if isinstance(got, Rejection) else got.error.kind


@pytest.mark.parametrize(("name", "raw", "expected", "given_id"), TABLE, ids=IDS)
def test_both_paths_accept_or_reject_each_input_as_its_definition_says(name, raw, expected, given_id):
    stream, offline = _stream(raw), _offline(raw)
    assert _outcome(stream) == _outcome(offline) == expected
    if expected == OK:
        assert stream.fields == offline.fields
        if given_id is None:
            assert (stream.id, offline.id) == ("in:0:9", "f.jsonl:1")  # each path's default id
        else:
            assert stream.id == offline.id == given_id


def test_the_last_of_duplicate_keys_wins_in_both_paths():
    raw = dict(zip(IDS, (r[1] for r in TABLE)))["duplicate key: the last wins"]
    assert _stream(raw).fields["text"] == _offline(raw).fields["text"] == "second"


def test_escapes_decode_to_the_same_text_in_both_paths():
    raw = dict(zip(IDS, (r[1] for r in TABLE)))["surrogate pair escape"]
    assert _stream(raw).fields["text"] == _offline(raw).fields["text"] == "\U0001f600"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"hello", "hello"), (BOM + b"hello", "hello"), (BOM, "empty_value"), (b"", "empty_value"), (b"\xc0\xaf", "invalid_utf8"),
     (b'{"not": "parsed"}', '{"not": "parsed"}')],
)
def test_text_input_fills_the_packs_field_alike_in_both_paths(raw, expected):
    stream = decode_value(raw, topic="in", partition=0, offset=1, input_format="text", text_field="body")
    offline = parse_line(raw, 1, input_format="text", text_field="body")
    if expected in ("empty_value", "invalid_utf8"):
        assert _outcome(stream) == _outcome(offline) == expected
    else:
        assert stream.fields == offline.fields == {"body": expected}


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_a_file_read_offline_gives_each_line_the_outcome_the_stream_gives_its_value(tmp_path, newline):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"".join(raw + newline for _, raw, _, _ in TABLE))
    summary = score_file(SlowEngine(pass_messages=7), str(src), str(dst))
    out = [orjson.loads(line) for line in dst.read_bytes().splitlines()]
    assert summary.lines == len(out) == len(TABLE)
    for (name, raw, _, _), rec in zip(TABLE, out):
        stream = _stream(raw.rstrip(b"\r"))  # what `spinf-stream produce` sends for that line
        if isinstance(stream, Rejection):
            assert rec["error"]["kind"] == stream.kind, name
        else:  # scored, or refused by the engine for the same reason the service's engine would
            if stream.id_given:
                assert rec["id"] == stream.id, name
            else:
                assert rec["id"].startswith("in.jsonl:"), name
            assert "digest" in rec or rec["error"]["kind"] == "missing_field", name


def test_a_file_that_starts_with_a_byte_order_mark_keeps_its_first_line(tmp_path):
    """The issue's case: a Windows tool's JSON Lines file; line 1 used to become invalid_json."""
    src, dst = tmp_path / "bom.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(BOM + b'{"id": "first", "text": "hello"}\r\n{"id": "second", "text": "there"}\r\n')
    score_file(SlowEngine(), str(src), str(dst))
    out = [orjson.loads(line) for line in dst.read_bytes().splitlines()]
    assert [r["id"] for r in out] == ["first", "second"] and all("digest" in r for r in out)


@pytest.mark.broker
def test_the_service_dead_letters_exactly_the_inputs_the_offline_command_rejects(topics, tmp_path):
    """End to end: every row through a real broker and the service, and through ``score``."""
    t = topics(1)
    values = [raw for _, raw, _, _ in TABLE]
    produce(t, values)
    scorer = FakeScorer()

    async def go() -> None:
        from spinf_stream.stream.service import ScoringService

        async with RunningService(ScoringService(run_settings(t), scorer, make_message=fake_message)) as s:
            await wait_for(lambda: s.stats.acked >= len(values), timeout_s=60)

    asyncio.run(go())
    written = read_all(t, [t.output, t.dlq], n=len(values))
    by_offset = {orjson.loads(r.value)["source"]["offset"]: orjson.loads(r.value) for r in written}
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_bytes(b"".join(v + b"\n" for v in values))
    score_file(SlowEngine(pass_messages=16), str(src), str(dst))
    offline = [orjson.loads(line) for line in dst.read_bytes().splitlines()]
    for offset, ((name, _, _, _), off) in enumerate(zip(TABLE, offline)):
        svc = by_offset[offset]
        svc_kind = svc["error"]["kind"] if "error" in svc else OK
        off_kind = off["error"]["kind"] if "error" in off else OK
        assert svc_kind == off_kind, name

