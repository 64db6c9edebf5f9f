"""A message field holding an image → the decoded picture, or the reason it is none.

A field holds an image as a JSON object ``{"image": "<base64>"}`` (RFC 4648 standard alphabet,
padding required) or as a data URL ``data:image/<png|jpeg|webp>;base64,<data>`` (RFC 2397);
raw bytes are read as given. Formats read: PNG, JPEG and WebP, decoded by Pillow.

Limits are checked before any pixel is decoded: the encoded bytes (``max_bytes``), the pixels
the header declares (``max_pixels``: a decompression bomb is refused from its header alone),
the smallest side (``min_side``) and the images of one message (``max_images``). The picture is
converted to RGB as transformers' image processors convert it (``convert_to_rgb``): a picture
with transparency (an alpha band, or a palette's or grey level's transparent entry) is composited
over opaque white, any other converted by Pillow. EXIF orientation is not applied (neither do they).

Rejection kinds: ``invalid_image`` (not base64, not an image, a format not read, truncated or
corrupt data, a side under ``min_side``) and ``image_too_large`` (over a limit). Messages name
the field and what is wrong, never the content.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image

__all__ = [
    "FORMATS", "ImageLimits", "ImageRejected", "base64_payload", "decode_image", "field_pictures", "is_image_value",
    "is_picture_value",
]

#: Pillow's format names of the formats read, by the MIME subtype of a data URL
FORMATS = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}

_DATA_URL = re.compile(r"^data:image/([a-z0-9.+-]+);base64,", re.IGNORECASE)


@dataclass(frozen=True)
class ImageLimits:
    """What one image, and one message's images, may be.

    Args:
        max_bytes: encoded bytes of one image (after base64 decoding).
        max_pixels: width × height one image's header may declare.
        min_side: the fewest pixels on either side.
        max_images: images in one message (a video's frames count).
        max_message_pixels: width × height of all of one message's images together (each
            checked from its header before it is decoded).
    """

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    min_side: int = 2
    max_images: int = 16
    max_message_pixels: int = 64_000_000


class ImageRejected(ValueError):
    """A field's image cannot be read: ``kind`` is ``invalid_image`` or ``image_too_large``,
    ``field`` the message field, the text what is wrong (never the content)."""

    def __init__(self, kind: str, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.kind = kind
        self.field = field


def is_image_value(value: Any) -> bool:
    """Whether a field's JSON value is meant as an image: an object with an ``image`` key, or a
    string that starts as a ``data:image/`` URL."""
    if isinstance(value, Mapping):
        return "image" in value
    return isinstance(value, str) and value[:11].lower() == "data:image/"


def _encoded(value: Any, field: str, limits: ImageLimits) -> tuple[bytes, str | None]:
    """The image's encoded bytes and the format its data URL names (``None``: any read)."""
    if isinstance(value, bytes | bytearray | memoryview):
        data, fmt = bytes(value), None
    else:
        if isinstance(value, Mapping):
            if set(value) != {"image"}:
                raise ImageRejected("invalid_image", field, f"an image object holds \"image\" only, got {sorted(value)}")
            text, fmt = value.get("image"), None
            if not isinstance(text, str):
                raise ImageRejected("invalid_image", field, f"\"image\" must be a base64 string, got {type(text).__name__}")
        elif isinstance(value, str):
            m = _DATA_URL.match(value)
            if m is None:
                raise ImageRejected("invalid_image", field, "a data URL must read data:image/<png|jpeg|webp>;base64,<data>")
            subtype = m.group(1).lower()
            fmt = FORMATS.get("jpeg" if subtype == "jpg" else subtype)
            if fmt is None:
                raise ImageRejected("invalid_image", field,
                                    f"image/{subtype} is not read (PNG, JPEG and WebP are)")
            text = value[m.end():]
        else:
            raise ImageRejected("invalid_image", field, f"an image is an object {{\"image\": base64}} or a data URL, "
                                f"got {type(value).__name__}")
        data = base64_payload(text, field, limits.max_bytes, "image")
    if len(data) > limits.max_bytes:
        raise ImageRejected("image_too_large", field, f"{len(data)} bytes encoded; at most {limits.max_bytes}")
    return data, fmt


def base64_payload(text: str, field: str, max_bytes: int, what: str) -> bytes:
    """The bytes of a picture's or video's base64 ``text`` (RFC 4648, padded), its size checked
    from the text's length before decoding.

    Raises:
        ImageRejected: ``image_too_large`` over ``max_bytes``; ``invalid_image`` for bad base64.
    """
    if len(text) // 4 * 3 > max_bytes + 3:
        raise ImageRejected("image_too_large", field, f"about {len(text) // 4 * 3} bytes encoded; at most {max_bytes}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRejected("invalid_image", field, f"the {what} is not valid base64") from None


def decode_image(value: Any, field: str, limits: ImageLimits = ImageLimits(), pixels_left: int | None = None) -> Image.Image:
    """A field's image decoded to RGB (``mode == "RGB"``, ``size == (width, height)`` pixels).
    ``pixels_left``: what the message's images may still hold (``None``: ``max_message_pixels``).

    Raises:
        ImageRejected: ``invalid_image`` or ``image_too_large`` (see the module's text).
    """
    data, want = _encoded(value, field, limits)
    if not data:
        raise ImageRejected("invalid_image", field, "the image has no bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=list(FORMATS.values()))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageRejected("image_too_large", field, f"its header declares over {limits.max_pixels} pixels") from None
    except Exception:  # Pillow's UnidentifiedImageError, or a header it cannot parse
        raise ImageRejected("invalid_image", field, "the bytes are not a PNG, JPEG or WebP image") from None
    if want is not None and img.format != want:
        raise ImageRejected("invalid_image", field, f"the data URL says {want}, the bytes are {img.format}")
    w, h = img.size
    if w * h > limits.max_pixels:
        raise ImageRejected("image_too_large", field, f"{w}×{h} pixels; at most {limits.max_pixels} in all")
    if w * h > (limits.max_message_pixels if pixels_left is None else pixels_left):
        raise ImageRejected("image_too_large", field, f"{w}×{h} pixels; the message's images hold at most "
                            f"{limits.max_message_pixels} together")
    if min(w, h) < limits.min_side:
        raise ImageRejected("invalid_image", field, f"{w}×{h} pixels; each side needs at least {limits.min_side}")
    try:
        img.load()
        return _rgb(img)
    except Exception:  # truncated or corrupt pixel data
        raise ImageRejected("invalid_image", field, f"the {img.format} data is truncated or corrupt") from None


def _rgb(img: Image.Image) -> Image.Image:
    """``img`` as RGB, transparency composited over opaque white (transformers' ``convert_to_rgb``)."""
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return img.convert("RGB")


def is_picture_value(value: Any) -> bool:
    """Whether a field's value holds pictures: an image (:func:`is_image_value`), a video
    (:func:`spinf_stream.video.is_video_value`), a non-empty array whose first item is an image
    (a video's frames), or bytes (a picture's, ``--input-format image``)."""
    from .video import is_video_value

    if isinstance(value, bytes | bytearray | memoryview) or is_image_value(value) or is_video_value(value):
        return True  # bytes: a record's value under --input-format image
    return isinstance(value, list) and bool(value) and is_image_value(value[0])


def field_pictures(value: Any, field: str, limits: ImageLimits = ImageLimits(), pixels_left: int | None = None,
                   ) -> list[Image.Image]:
    """A picture field's pictures, RGB, in order: one for an image, the frames taken for a video
    or given as an array. ``pixels_left``: what the message's pictures may still hold (``None``:
    ``limits.max_message_pixels``).

    Raises:
        ImageRejected: ``invalid_image`` or ``image_too_large`` (frames past ``max_images``, or
            pixels past ``pixels_left``, too).
    """
    from .video import decode_video, is_video_value

    left = limits.max_message_pixels if pixels_left is None else pixels_left
    if is_video_value(value):
        return decode_video(value, field, images=limits, pixels_left=left)
    if isinstance(value, list):
        if len(value) > limits.max_images:
            raise ImageRejected("image_too_large", field, f"{len(value)} frames; a message holds at most {limits.max_images} images")
        frames = []
        for i, v in enumerate(value):
            frames.append(decode_image(v, f"{field}[{i}]", limits, left))
            left -= frames[-1].width * frames[-1].height
        return frames
    return [decode_image(value, field, limits, left)]
