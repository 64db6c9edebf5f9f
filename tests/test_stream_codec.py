"""Decoding input records, building dead-letter records and headers, the stream records' schemas."""

from __future__ import annotations

import base64

import orjson
import pytest

from spinf_stream.records import ModelRef, NumericsRef
from spinf_stream.stream.codec import Decoded, Rejection, check_pack_header, decode_value
from spinf_stream.stream.consume import format_record
from spinf_stream.stream.dlq import dead_letter, dead_letter_bytes, output_headers
from spinf_stream.stream.produce import lines_of, record_key
from spinf_stream.stream.records import DeadLetterRecord, Source, StreamScoreRecord

MODEL = ModelRef(
    name="smollm2-135m", sha256="ab" * 32, device="cuda", dtype="bfloat16", kernels="triton",
    numerics=NumericsRef(isa="sm_90", library="triton 3.6.0, torch 2.11.0", tiles="gemm 128x256x64", bits_probe="not_needed"),
)


def decode(value: bytes | None, fmt: str = "json") -> Decoded | Rejection:
    return decode_value(value, topic="in", partition=2, offset=41, input_format=fmt)  # type: ignore[arg-type]


def test_a_json_object_with_an_id_keeps_its_id_and_fields():
    d = decode(b'{"id": "m1", "text": "hi", "lang": "en"}')
    assert d == Decoded("m1", {"id": "m1", "text": "hi", "lang": "en"}, id_given=True)


def test_an_integer_id_is_taken_as_its_decimal_string_like_offline_score():
    d = decode(b'{"id": 7, "text": "hi"}')
    assert isinstance(d, Decoded) and d.id == "7"


def test_without_an_id_the_id_is_topic_partition_offset():
    d = decode(b'{"text": "hi"}')
    assert isinstance(d, Decoded) and d.id == "in:2:41" and not d.id_given


def test_a_null_id_means_the_default_id():
    d = decode(b'{"id": null, "text": "hi"}')
    assert isinstance(d, Decoded) and d.id == "in:2:41"


def test_text_format_takes_the_bytes_as_the_text_field():
    d = decode('{"not": "parsed"} ünïcode'.encode(), "text")
    assert d == Decoded("in:2:41", {"text": '{"not": "parsed"} ünïcode'}, id_given=False)


def test_a_byte_order_mark_is_ignored():
    assert isinstance(decode(b'\xef\xbb\xbf{"text": "hi"}'), Decoded)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "null_value"),
        (b"", "empty_value"),
        (b"\xff\xfe\x00garbage", "invalid_utf8"),
        (b'{"text": "caf\xe9"}', "invalid_utf8"),
        (b"hello world", "invalid_json"),
        (b'{"text": "unterminated', "invalid_json"),
        (b'{"text": "\\ud800"}', "invalid_json"),
        (b'{"a": NaN}', "invalid_json"),
        (b"[" * 2000 + b"]" * 2000, "invalid_json"),
        (b'["a", "list"]', "not_an_object"),
        (b'"a string"', "not_an_object"),
        (b"42", "not_an_object"),
        (b"null", "not_an_object"),
        (b'{"id": true, "text": "hi"}', "wrong_type"),
        (b'{"id": {"a": 1}, "text": "hi"}', "wrong_type"),
        (b'{"id": "", "text": "hi"}', "empty_field"),
        (b'{"id": "  ", "text": "hi"}', "empty_field"),
    ],
)
def test_bad_values_are_rejected_with_a_machine_readable_kind(value, kind):
    r = decode(value)
    assert isinstance(r, Rejection)
    assert r.kind == kind


def test_rejection_messages_never_quote_the_content():
    secret = b"my password is hunter2"
    for value in (secret, b'["' + secret + b'"]', secret + b"\xff"):
        r = decode(value)
        assert isinstance(r, Rejection)
        assert "hunter2" not in r.message


def test_text_format_still_rejects_bytes_that_are_not_utf8():
    r = decode(b"\xc3\x28", "text")
    assert isinstance(r, Rejection) and r.kind == "invalid_utf8"


@pytest.mark.parametrize(
    ("header", "ok"),
    [(b"spam", True), (b"spam@1.0.0", True), (b"spam@2.0.0", False), (b"sentiment", False), (b"\xff", False)],
)
def test_the_spinf_pack_header_must_name_the_running_pack(header, ok):
    r = check_pack_header([("spinf-pack", header)], pack_name="spam", pack_version="1.0.0")
    assert (r is None) == ok
    if not ok:
        assert r.kind == "unknown_pack"


def test_records_without_a_pack_header_are_for_any_pack():
    assert check_pack_header([("traceparent", b"00-x")], pack_name="spam", pack_version="1") is None
    assert check_pack_header(None, pack_name="spam", pack_version="1") is None


def test_a_dead_letter_record_keeps_the_original_bytes_key_and_headers():
    value, key = b"\x00\xffbinary", b"k1"
    headers = [("traceparent", b"00-abc-def-01"), ("x-empty", None)]
    rec = dead_letter(
        kind="invalid_utf8", message="bad", source=Source(topic="in", partition=1, offset=9, timestamp=123),
        value=value, key=key, headers=headers, pack=("spam", "1.0.0"), model=MODEL,
    )
    data = orjson.loads(dead_letter_bytes(rec))
    assert base64.b64decode(data["value_b64"]) == value
    assert base64.b64decode(data["key_b64"]) == key
    assert data["headers"] == [{"key": "traceparent", "value_b64": base64.b64encode(b"00-abc-def-01").decode()}, {"key": "x-empty", "value_b64": None}]
    assert data["source"] == {"topic": "in", "partition": 1, "offset": 9, "timestamp": 123}
    assert data["error"]["kind"] == "invalid_utf8"
    assert data["value_size"] == len(value) and data["value_truncated"] is False
    assert data["model"] == MODEL.model_dump()
    DeadLetterRecord.model_validate(data)


def test_a_tombstone_dead_letter_has_null_value_and_key():
    rec = dead_letter(kind="null_value", message="", source=Source(topic="t", partition=0, offset=0, timestamp=None),
                      value=None, key=None, headers=[])
    data = orjson.loads(dead_letter_bytes(rec))
    assert data["value_b64"] is None and data["key_b64"] is None and data["value_size"] is None


def test_an_oversized_value_is_cut_in_the_dead_letter_record_and_flagged():
    value = bytes(range(256)) * 10
    rec = dead_letter(kind="too_long", message="", source=Source(topic="t", partition=0, offset=0, timestamp=0),
                      value=value, key=None, headers=[], max_value_bytes=100)
    assert base64.b64decode(rec.value_b64) == value[:100]
    assert rec.value_truncated and rec.value_size == len(value)


def test_the_too_long_policy_is_stated_in_the_dead_letter_record():
    rec = dead_letter(kind="too_long", message="x", source=Source(topic="t", partition=0, offset=0, timestamp=0),
                      value=b"{}", key=None, headers=[], policy="reject")
    assert orjson.loads(dead_letter_bytes(rec))["error"]["policy"] == "reject"


def test_output_headers_name_pack_model_device_and_dtype_and_pass_trace_context_through():
    h = output_headers(
        [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), ("tracestate", b"a=b"), ("other", b"x")],
        pack_name="spam", pack_version="1.0.0", model=MODEL,
    )
    assert h == [
        ("spinf-pack", b"spam@1.0.0"),
        ("spinf-model", b"smollm2-135m"),
        ("spinf-device", b"cuda"),
        ("spinf-dtype", b"bfloat16"),
        ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ("tracestate", b"a=b"),
    ]


def test_dead_letter_headers_carry_the_error_kind():
    h = dict(output_headers([], pack_name="p", pack_version="1", model=MODEL, error_kind="invalid_json"))
    assert h["spinf-error-kind"] == b"invalid_json"


def test_stream_score_record_is_the_score_record_plus_source():
    score = {
        "id": "m1", "pack": {"name": "spam", "version": "1.0.0", "special_tokens_in_fields": "plain"}, "model": MODEL.model_dump(),
        "scores": {"spam": {"answer": "no", "choices": {"yes": {"probability": 0.25, "logprob": -2.0, "floor": 0.135}, "no": {"probability": 0.75, "logprob": -0.9, "floor": 0.4}}}},
        "digest": "sha256:" + "0" * 64,
        "source": {"topic": "in", "partition": 0, "offset": 3, "timestamp": 1},
    }
    assert StreamScoreRecord.model_validate(score).source.offset == 3
    with pytest.raises(ValueError):
        StreamScoreRecord.model_validate({**score, "unexpected": 1})


def test_produce_keys_come_from_the_key_field():
    assert record_key(b'{"id": "a1", "text": "x"}', "id") == b"a1"
    assert record_key(b'{"id": 12}', "id") == b"12"
    assert record_key(b'{"text": "x"}', "id") is None
    assert record_key(b"not json", "id") is None
    assert record_key(b'{"id": "a1"}', None) is None


def test_produce_reads_non_blank_lines_unchanged():
    assert lines_of([b'{"a": 1}\n', b"\n", b"  \r\n", b'{"b": 2}\r\n', b"last"]) == [b'{"a": 1}', b'{"b": 2}', b"last"]


class _Rec:
    def __init__(self, value, key=None, headers=()):
        self.topic, self.partition, self.offset, self.timestamp = "t", 1, 5, 99
        self.value, self.key, self.headers = value, key, headers


def test_consume_prints_json_values_byte_for_byte():
    raw = b'{"b":1.0000000000000002,"a":[1,2]}'
    assert format_record(_Rec(raw)) == raw


def test_consume_prints_other_values_as_json_strings():
    assert orjson.loads(format_record(_Rec(b"plain text"))) == "plain text"
    assert orjson.loads(format_record(_Rec(b"\xff"))) == {"b64": "/w=="}
    assert orjson.loads(format_record(_Rec(None))) is None


def test_consume_metadata_wraps_the_value():
    line = format_record(_Rec(b'{"x": 1}', key=b"k", headers=[("h", b"v")]), with_metadata=True)
    assert orjson.loads(line) == {"topic": "t", "partition": 1, "offset": 5, "timestamp": 99, "key": "k", "headers": [["h", "v"]], "value": {"x": 1}}
