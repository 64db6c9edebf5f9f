"""Decoding input records, building dead-letter records and headers, the stream records' schemas."""

from __future__ import annotations

import base64
import hashlib
import struct

import orjson
import pytest

from spinf_stream.engine.results import ModelRef, NumericsRef
from spinf_stream.stream.codec import Decoded, Rejection, check_pack_header, decode_value
from spinf_stream.stream.consume import format_record
from spinf_stream.stream.dlq import dead_letter, dead_letter_bytes, output_headers, record_size
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
    letter = dead_letter(
        kind="invalid_utf8", message="bad", source=Source(topic="in", partition=1, offset=9, timestamp=123),
        value=value, key=key, headers=headers, pack=("spam", "1.0.0"), model=MODEL,
    )
    data = orjson.loads(letter.value)
    assert letter.value == dead_letter_bytes(letter.record) and letter.key == key
    assert base64.b64decode(data["value_b64"]) == value
    assert base64.b64decode(data["key_b64"]) == key
    assert data["headers"] == [
        {"key": "traceparent", "key_b64": None, "value_b64": base64.b64encode(b"00-abc-def-01").decode()},
        {"key": "x-empty", "key_b64": None, "value_b64": None},
    ]
    assert data["source"] == {"topic": "in", "partition": 1, "offset": 9, "timestamp": 123}
    assert data["error"]["kind"] == "invalid_utf8"
    assert data["value_size"] == len(value) and data["value_truncated"] is False and data["cut"] == []
    assert data["model"] == MODEL.model_dump()
    DeadLetterRecord.model_validate(data)


def test_a_tombstone_dead_letter_has_null_value_and_key():
    letter = dead_letter(kind="null_value", message="", source=Source(topic="t", partition=0, offset=0, timestamp=None),
                         value=None, key=None, headers=[])
    data = orjson.loads(letter.value)
    assert data["value_b64"] is None and data["key_b64"] is None and data["value_size"] is None


def test_a_header_key_that_is_not_utf8_is_kept_in_base64():
    letter = dead_letter(kind="undecodable_record", message="", source=Source(topic="t", partition=0, offset=0, timestamp=0),
                         value=b"{}", key=None, headers=[(b"\xff\xfek", b"v")])
    (h,) = orjson.loads(letter.value)["headers"]
    assert base64.b64decode(h["key_b64"]) == b"\xff\xfek" and h["key"] == "\\xff\\xfek"


def _hsha(headers):
    h = hashlib.sha256()
    for k, v in headers:
        kb = k.encode() if isinstance(k, str) else k
        h.update(struct.pack(">I", len(kb)) + kb + (b"\xff\xff\xff\xff" if v is None else struct.pack(">I", len(v)) + v))
    return h.hexdigest()


@pytest.mark.parametrize(
    "value_size, key_size, n_headers, header_size",
    [
        (5_000_000, 0, 0, 0),          # a huge value
        (10, 1_000_000, 0, 0),         # the breaker's 1 MB key on a small bad value
        (1_500_000, 1_000_000, 0, 0),  # both
        (100, 0, 1000, 1024),          # 1,000 headers of 1 KB
        (900_000, 200_000, 300, 1024), # all three
        (1_048_000, 0, 0, 0),          # just over the limit once wrapped in base64
    ],
)
@pytest.mark.parametrize("limit", [1024 * 1024, 200_000])
def test_a_dead_letter_always_fits_the_limit_and_says_what_was_cut(value_size, key_size, n_headers, header_size, limit):
    value = bytes(range(256)) * (value_size // 256) + b"x" * (value_size % 256)
    key = (b"k" * key_size) or None
    headers = [(f"h{i}", bytes([i % 256]) * header_size) for i in range(n_headers)]
    out = output_headers(headers, pack_name="spam", pack_version="1", model=MODEL, error_kind="invalid_json")
    letter = dead_letter(kind="invalid_json", message="m", source=Source(topic="t", partition=0, offset=7, timestamp=0),
                         value=value, key=key, headers=headers, max_bytes=limit, out_headers=out)
    # the size aiokafka's producer checks, computed here from the definition of record format v2
    assert record_size(letter.key, letter.value, out) <= limit
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=2**30)
    builder.append(0, timestamp=0, key=letter.key, value=letter.value, headers=out)
    assert len(builder.build()) <= limit
    data = orjson.loads(letter.value)
    DeadLetterRecord.model_validate(data)
    cuts = {c["part"]: c for c in data["cut"]}
    kept_value = base64.b64decode(data["value_b64"])
    assert value.startswith(kept_value) and data["value_size"] == len(value)
    if len(kept_value) < len(value):
        assert cuts["value"] == {"part": "value", "size": len(value), "kept": len(kept_value), "count": None,
                                 "sha256": hashlib.sha256(value).hexdigest()}
        assert data["value_truncated"]
    else:
        assert "value" not in cuts
    if key:
        kept_key = base64.b64decode(data["key_b64"])
        assert key.startswith(kept_key) and letter.key == kept_key
        if len(kept_key) < len(key):
            assert cuts["key"]["size"] == len(key) and cuts["key"]["sha256"] == hashlib.sha256(key).hexdigest()
    if headers:
        kept = data["headers"]
        assert [h["key"] for h in kept] == [k for k, _ in headers[: len(kept)]]
        if len(kept) < len(headers):
            assert cuts["headers"]["count"] == len(headers) and cuts["headers"]["kept"] == len(kept)
            assert cuts["headers"]["sha256"] == _hsha(headers)
            assert cuts["headers"]["size"] == sum(len(k) + len(v) for k, v in headers)
    # something of every part is kept when the limit allows it
    assert len(kept_value) > 0


def test_a_dead_letter_that_fits_keeps_everything():
    value, key = b"v" * 100_000, b"k" * 1000
    headers = [(f"h{i}", b"x" * 100) for i in range(50)]
    letter = dead_letter(kind="invalid_json", message="", source=Source(topic="t", partition=0, offset=0, timestamp=0),
                         value=value, key=key, headers=headers)
    data = orjson.loads(letter.value)
    assert data["cut"] == [] and len(data["headers"]) == 50 and letter.key == key
    assert base64.b64decode(data["value_b64"]) == value


def test_the_too_long_policy_is_stated_in_the_dead_letter_record():
    letter = dead_letter(kind="too_long", message="x", source=Source(topic="t", partition=0, offset=0, timestamp=0),
                         value=b"{}", key=None, headers=[], policy="reject")
    assert orjson.loads(letter.value)["error"]["policy"] == "reject"


def test_trace_headers_longer_than_the_w3c_sizes_are_not_passed_through():
    h = output_headers([("traceparent", b"0" * 100_000), ("tracestate", b"a=b")], pack_name="p", pack_version="1", model=MODEL)
    assert ("tracestate", b"a=b") in h and all(k != "traceparent" for k, _ in h)


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
