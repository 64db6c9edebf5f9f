"""Image fields: every accepted form decodes to the pixels that were encoded, and every kind of bad
image (truncated, too small, a decompression bomb's header, not an image, a format not read,
over a limit) is refused with its kind, naming the field, before its pixels are decoded."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from spinf_stream.images import ImageLimits, ImageRejected, decode_image, field_pictures, is_image_value

RNG = np.random.default_rng(7)
PIXELS = RNG.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)  # [height, width, RGB]


def encoded(fmt: str, pixels: np.ndarray = PIXELS, mode: str | None = None, **save: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(buf, format=fmt, **save)
    return buf.getvalue()


def as_object(data: bytes) -> dict[str, str]:
    return {"image": base64.b64encode(data).decode()}


def as_data_url(data: bytes, subtype: str) -> str:
    return f"data:image/{subtype};base64,{base64.b64encode(data).decode()}"


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header(width: int, height: int) -> bytes:
    """A PNG (8-bit RGB) declaring ``width``×``height`` whose data is one short IDAT chunk: what a
    decompression bomb looks like before its pixels are inflated."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(1000)))


def rejected(value: object, kind: str, limits: ImageLimits = ImageLimits()) -> str:
    with pytest.raises(ImageRejected) as exc:
        decode_image(value, "photo", limits)
    assert exc.value.kind == kind and exc.value.field == "photo"
    assert "photo" in str(exc.value)
    return str(exc.value)


@pytest.mark.parametrize("form", ["object", "data_url", "bytes"])
@pytest.mark.parametrize(("fmt", "subtype"), [("PNG", "png"), ("WEBP", "webp")])
def test_a_lossless_image_decodes_to_the_pixels_encoded_in_every_form(form, fmt, subtype):
    data = encoded(fmt, lossless=True) if fmt == "WEBP" else encoded(fmt)
    value = {"object": as_object(data), "data_url": as_data_url(data, subtype), "bytes": data}[form]
    img = decode_image(value, "photo")
    assert img.mode == "RGB" and img.size == (7, 5)
    assert np.array_equal(np.asarray(img), PIXELS)


def test_a_jpeg_decodes_as_pillow_reads_it_and_jpg_names_it_too():
    data = encoded("JPEG", quality=90)
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    for value in (as_object(data), as_data_url(data, "jpeg"), as_data_url(data, "jpg")):
        assert np.array_equal(np.asarray(decode_image(value, "photo")), want)


def test_alpha_and_palettes_become_rgb_as_transformers_converts_them():
    from transformers.image_transforms import convert_to_rgb

    rgba = RNG.integers(0, 256, size=(4, 6, 4), dtype=np.uint8)
    palette = Image.fromarray(PIXELS).convert("P")
    for data in (encoded("PNG", rgba), encoded("PNG", PIXELS[..., 0], mode="L"), encoded("PNG", np.asarray(palette)),
                 encoded("PNG", np.asarray(palette), mode="P", transparency=int(np.asarray(palette)[0, 0])),
                 encoded("WEBP", rgba, lossless=True)):
        want = convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True)
        assert np.array_equal(np.asarray(decode_image(data, "photo")), want)


def test_bad_images_are_refused_with_their_kind():
    png = encoded("PNG")
    assert "truncated or corrupt" in rejected(png[: len(png) // 2], "invalid_image")
    assert "1×1" in rejected(encoded("PNG", PIXELS[:1, :1]), "invalid_image")
    assert "not a PNG, JPEG or WebP" in rejected(b"GIF89a" + bytes(40), "invalid_image")
    assert "not a PNG, JPEG or WebP" in rejected(encoded("GIF"), "invalid_image")
    assert "not a PNG, JPEG or WebP" in rejected(b'{"text": "hello"}', "invalid_image")
    assert "no bytes" in rejected(b"", "invalid_image")
    assert "base64" in rejected({"image": "not base64!"}, "invalid_image")
    assert "base64 string" in rejected({"image": 12}, "invalid_image")
    assert "image/gif is not read" in rejected(as_data_url(encoded("GIF"), "gif"), "invalid_image")
    assert "the bytes are PNG" in rejected(as_data_url(png, "jpeg"), "invalid_image")
    assert "data:image/" in rejected("data:image/png,rawbytes", "invalid_image")
    assert "got list" in rejected([1, 2], "invalid_image")


def test_a_decompression_bombs_header_is_refused_before_any_pixel_is_decoded():
    assert "over" in rejected(png_header(10_000, 10_000), "image_too_large")  # 100 megapixels in 60 bytes
    assert "7000×7000" in rejected(png_header(7000, 7000), "image_too_large")  # over the 40 MP default
    msg = rejected(encoded("PNG"), "image_too_large", ImageLimits(max_pixels=34))
    assert "7×5 pixels" in msg and "34" in msg


def test_encoded_bytes_over_the_limit_are_refused_before_decoding():
    data = encoded("PNG")
    limits = ImageLimits(max_bytes=len(data) - 1)
    for value in (data, as_object(data), as_data_url(data, "png")):
        rejected(value, "image_too_large", limits)
    assert np.array_equal(np.asarray(decode_image(data, "photo", ImageLimits(max_bytes=len(data)))), PIXELS)


def test_a_fields_pictures_are_its_image_or_frames_within_the_count_limit():
    data = encoded("PNG")
    fields = {"caption": "a cat", "photo": as_object(data), "thumb": as_data_url(data, "png"), "meta": {"w": 7}}
    assert [is_image_value(v) for v in fields.values()] == [False, True, True, False]
    got = [field_pictures(fields[f], f) for f in ("photo", "thumb")]
    assert all(len(g) == 1 and np.array_equal(np.asarray(g[0]), PIXELS) for g in got)
    with pytest.raises(ImageRejected) as exc:
        field_pictures([as_object(data), as_data_url(data, "png")], "thumb", ImageLimits(max_images=1))
    assert exc.value.kind == "image_too_large" and exc.value.field == "thumb"
    with pytest.raises(ImageRejected) as exc:
        field_pictures([as_object(data), {"image": "!!"}], "b")
    assert exc.value.kind == "invalid_image" and exc.value.field == "b[1]"
