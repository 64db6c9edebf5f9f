"""Video fields and hostile picture input (a breaker's findings, as kinds): FFmpeg opens only
MP4/MOV and WebM/Matroska by name (never a playlist that opens another file), decodes no frame
over the pixel limit, stops at the video's end, and a message's pictures are bounded together."""

from __future__ import annotations

import base64
import io

import av
import numpy as np
import pytest
from PIL import Image

from spinf_stream.images import ImageLimits, ImageRejected, field_pictures, is_picture_value
from spinf_stream.video import decode_video


def encoded(frames: list[np.ndarray], rate: int = 4, fmt: str = "mp4", codec: str = "mpeg4") -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        for f in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def kind_of(value, **kw) -> str:
    with pytest.raises(ImageRejected) as e:
        field_pictures(value, "clip", **kw)
    assert "clip" in str(e.value)
    return e.value.kind


def test_a_playlist_that_names_a_local_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.mp4").write_bytes(encoded([np.zeros((16, 16, 3), np.uint8)] * 2))
    assert kind_of({"video": b64(b"ffconcat version 1.0\nfile secret.mp4\n")}) == "invalid_image"
    assert kind_of({"video": b64(b"#EXTM3U\n#EXTINF:1,\nsecret.mp4\n")}) == "invalid_image"


def test_formats_other_than_mp4_and_webm_are_refused_as_videos():
    assert kind_of({"video": b64(png(32, 32))}) == "invalid_image"
    frames = [np.full((16, 16, 3), 40 * i, np.uint8) for i in range(4)]
    assert len(decode_video({"video": b64(encoded(frames, fmt="webm", codec="libvpx")), "fps": 4}, "clip")) == 4
    assert len(decode_video({"video": b64(encoded(frames)), "fps": 4}, "clip")) == 4


def test_no_frame_over_the_pixel_limit_is_decoded():
    big = encoded([np.zeros((1200, 1000, 3), np.uint8)])
    assert kind_of({"video": b64(big)}, limits=ImageLimits(max_pixels=1_000_000)) == "image_too_large"
    assert len(field_pictures({"video": b64(big)}, "clip", ImageLimits(max_pixels=1_200_000))) == 1


@pytest.mark.parametrize("fps", [10**400, -1, 0, "1", True, float("inf")])
def test_a_bad_fps_is_invalid(fps):
    assert kind_of({"video": b64(encoded([np.zeros((16, 16, 3), np.uint8)])), "fps": fps}) == "invalid_image"


def test_unknown_keys_beside_an_image_or_a_video_are_invalid():
    assert is_picture_value({"image": "AAAA", "alt": "x"}) and is_picture_value({"video": "AAAA", "x": 1})
    assert kind_of({"image": b64(png(8, 8)), "alt": "x"}) == "invalid_image"
    assert kind_of({"video": b64(encoded([np.zeros((16, 16, 3), np.uint8)])), "x": 1}) == "invalid_image"


def test_a_tiny_fps_takes_the_first_frame_and_stops_at_the_end():
    frames = [np.full((16, 16, 3), 20 * i, np.uint8) for i in range(12)]
    got = decode_video({"video": b64(encoded(frames)), "fps": 1e-6}, "clip")
    assert len(got) == 1 and np.asarray(got[0]).mean() < 10


def test_a_messages_pictures_are_bounded_together():
    limits = ImageLimits(max_message_pixels=3 * 64 * 64)
    assert len(field_pictures([{"image": b64(png(64, 64))}] * 3, "clip", limits)) == 3
    assert kind_of([{"image": b64(png(64, 64))}] * 4, limits=limits) == "image_too_large"
    frames = [np.zeros((64, 64, 3), np.uint8)] * 8
    assert kind_of({"video": b64(encoded(frames)), "fps": 4}, limits=limits) == "image_too_large"
