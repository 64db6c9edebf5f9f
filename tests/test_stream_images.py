"""Picture messages through ``spinf-stream score``, ``serve`` and the Kafka service, on the tiny
multimodal Gemma 3 (and Idefics3 through the service) and the real broker: the example product
photos score as offline; broken or oversized pictures (a truncated PNG, a 1-pixel image, a
100-megapixel header, bytes that are no image, a video that is none) go to the dead-letter topic
with their reason, and nothing stops the partition."""

from __future__ import annotations

import asyncio
import os
import base64
import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import orjson
import pytest
from PIL import Image

from broker import RunningService, committed_offsets, json_line, produce, read_all, run_settings, tansu, topics, wait_for  # noqa: F401
from spinf_stream.engine import Engine, Message
from spinf_stream.stream.service import ScoringService

REPO = Path(__file__).resolve().parent.parent
PACK = REPO / "examples" / "product_photo.yaml"
PHOTOS = REPO / "examples" / "product_photos.jsonl"


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def huge_header_png() -> bytes:
    """A PNG whose header declares 10,000 × 10,000 pixels, in under 100 bytes."""
    ihdr = struct.pack(">IIBBBBB", 10_000, 10_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + _chunk(b"IEND", b"")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


#: id → (photo field, the dead letter's kind)
BAD = {
    "truncated": ({"image": b64(_png(Image.new("RGB", (64, 64), (9, 99, 199)))[:60])}, "invalid_image"),
    "one_pixel": ({"image": b64(_png(Image.new("RGB", (1, 1))))}, "invalid_image"),
    "huge_header": ({"image": b64(huge_header_png())}, "image_too_large"),
    "not_an_image": ({"image": b64(b"GIF? no: plain bytes " * 4)}, "invalid_image"),
    "not_a_video": ({"video": b64(b"\x00\x00\x00\x18ftypmp42 and then nothing")}, "invalid_image"),
}


def test_the_example_photos_are_the_scripts_drawings():
    out = subprocess.run([sys.executable, str(REPO / "examples" / "make_product_photos.py")], capture_output=True,
                         check=True)
    assert out.stdout == PHOTOS.read_bytes(), "examples/product_photos.jsonl: rerun examples/make_product_photos.py"


def test_score_reads_the_example_photos_as_the_engine_does(tiny_vl, tmp_path):
    out = tmp_path / "scores.jsonl"
    subprocess.run([sys.executable, "-m", "spinf_stream.cli", "score", "--model", str(tiny_vl), "--pack", str(PACK),
                    "--input", str(PHOTOS), "--output", str(out)], check=True, capture_output=True)
    got = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    rows = [orjson.loads(line) for line in PHOTOS.read_bytes().splitlines()]
    engine = Engine.load(model=str(tiny_vl), pack=PACK)
    want = engine.score([Message(r["id"], r) for r in rows])
    assert [g["id"] for g in got] == [r["id"] for r in rows]
    assert [g["digest"] for g in got] == [w.digest for w in want]
    assert set(got[0]["scores"]) == {"matches_title", "plain_background", "damaged", "category"}


@pytest.mark.parametrize("family", ["gemma3", "idefics3"])
def test_the_service_scores_photos_and_dead_letters_bad_ones(topics, request, family):
    tiny_vl = request.getfixturevalue("tiny_vl" if family == "gemma3" else "tiny_idefics3")
    t = topics(2)
    good = [orjson.loads(line) for line in PHOTOS.read_bytes().splitlines()]
    bad = [{"id": k, "photo": v, "title": "a product"} for k, (v, _) in BAD.items()]
    messages = [m for pair in zip(good, bad) for m in pair] + good[len(bad):]
    metas = produce(t, [json_line(m) for m in messages], keys=[m["id"].encode() for m in messages])
    engine = Engine.load(model=str(tiny_vl), pack=PACK, token_budget=256)
    settings = run_settings(t, model=str(tiny_vl), pack=str(PACK), token_budget=256)

    async def go() -> ScoringService:
        svc = ScoringService(settings, engine)
        async with RunningService(svc) as s:
            await wait_for(lambda: s.stats.acked >= len(messages), timeout_s=300, interval_s=0.1)
        return svc

    svc = asyncio.run(go())
    scores = {orjson.loads(r.value)["id"]: orjson.loads(r.value) for r in read_all(t, [t.output], n=len(good))}
    dead = {orjson.loads(r.value)["id"]: orjson.loads(r.value) for r in read_all(t, [t.dlq], n=len(bad))}
    offline = {r.id: r.digest for r in engine.score([Message(m["id"], m) for m in good])}
    assert {k: v["digest"] for k, v in scores.items()} == offline
    assert {k: v["error"]["kind"] for k, v in dead.items()} == {k: kind for k, (_, kind) in BAD.items()}
    assert all("photo" in v["error"]["message"] for v in dead.values())
    assert svc.stats.dead_lettered == len(bad)
    end: dict[int, int] = {}
    for m in metas:
        end[m.partition] = max(end.get(m.partition, 0), m.offset + 1)
    assert committed_offsets(t, settings.group_id) == end


def test_serve_scores_photos_as_the_engine_does(tiny_vl, tmp_path):
    """``spinf-stream serve`` with the example pack: /v1/score takes picture fields as the input
    topic does; a bad picture is an error record in its place."""
    import httpx
    from test_api import wait_for_api

    from broker import CLI
    from spinf_stream.stream.broker import free_port

    port, log = free_port(), tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPINF_") or k == "SPINF_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO)
    with open(log, "wb") as out:
        proc = subprocess.Popen([*CLI, "serve", "--model", str(tiny_vl), "--pack", str(PACK), "--token-budget", "512",
                                 "--api-port", str(port), "--device", "cpu", "--dtype", "float32"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = wait_for_api(port, proc, log)
        rows = [orjson.loads(line) for line in PHOTOS.read_bytes().splitlines()][:3]
        bad = {"id": "bad", "photo": BAD["truncated"][0], "title": "a mug"}
        r = httpx.post(f"{url}/v1/score", json={"pack": "product_photo", "messages": [*rows, bad]}, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()["records"]
    finally:
        proc.terminate()
        proc.wait(30)
    want = Engine.load(model=str(tiny_vl), pack=PACK, token_budget=512).score([Message(m["id"], m) for m in rows])
    assert [g["digest"] for g in got[:3]] == [w.digest for w in want]
    assert got[3]["error"]["kind"] == "invalid_image"


def test_input_format_image_reads_a_pictures_bytes_with_its_fields_in_a_header(topics, tiny_vl):
    """``--input-format image``: the value is the picture, in the pack's first field; the other
    fields and the id come from the ``spinf-fields`` header. A bad header or bad bytes are dead
    letters; the scores equal the JSON messages'."""
    t = topics(1)
    rows = [orjson.loads(line) for line in PHOTOS.read_bytes().splitlines()][:4]
    values = [base64.b64decode(r["photo"]["image"]) for r in rows]
    headers = [[("spinf-fields", orjson.dumps({"id": r["id"], "title": r["title"]}))] for r in rows]
    values += [b"not a picture", values[0], values[0], values[0]]
    headers += [[("spinf-fields", b'{"id": "junk", "title": "x"}')], [("spinf-fields", b"{not json")],
                [("spinf-fields", b'["a list"]')], None]
    produce(t, values, headers=headers)
    engine = Engine.load(model=str(tiny_vl), pack=PACK, token_budget=256)
    settings = run_settings(t, model=str(tiny_vl), pack=str(PACK), token_budget=256, input_format="image")

    async def go() -> None:
        async with RunningService(ScoringService(settings, engine)) as s:
            await wait_for(lambda: s.stats.acked >= len(values), timeout_s=300, interval_s=0.1)

    asyncio.run(go())
    scores = {orjson.loads(r.value)["id"]: orjson.loads(r.value)["digest"] for r in read_all(t, [t.output], n=4)}
    assert scores == {r.id: r.digest for r in engine.score([Message(r["id"], r) for r in rows])}
    dead = sorted(orjson.loads(r.value)["error"]["kind"] for r in read_all(t, [t.dlq], n=4))
    assert dead == ["invalid_image", "invalid_json", "missing_field", "not_an_object"]
