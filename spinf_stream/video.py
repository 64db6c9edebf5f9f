"""A message field holding a video → the frames the model reads, or the reason it has none.

A field holds a video as a JSON object ``{"video": "<base64>"}`` with an optional ``"fps"``
(frames per second to take, a positive number; default :attr:`VideoLimits.fps`). The container
and codec are whatever FFmpeg reads (MP4 with H.264 or MPEG-4 Part 2, WebM, ...), decoded by
PyAV. Frames taken: for k = 0, 1, 2, ... the first decoded frame whose presentation time is at
or after ``k / fps`` seconds, the first :attr:`VideoLimits.max_frames` of them. Each is converted
to RGB by FFmpeg's ``rgb24`` conversion and read as a picture (:mod:`spinf_stream.images`).

A field may instead hold the frames themselves: a JSON array of images, in order.

Rejection kinds: ``invalid_image`` (not base64, not a video FFmpeg decodes, no frame, a bad
``fps``) and ``image_too_large`` (encoded bytes or frame pixels over a limit).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image

from .images import ImageLimits, ImageRejected

__all__ = ["VideoLimits", "decode_video", "is_video_value"]


@dataclass(frozen=True)
class VideoLimits:
    """What one video may be: ``max_bytes`` encoded, ``max_frames`` taken, ``fps`` taken by
    default (frames per second of video time)."""

    max_bytes: int = 64 * 1024 * 1024
    max_frames: int = 8
    fps: float = 1.0


def is_video_value(value: Any) -> bool:
    """Whether a field's JSON value is meant as a video: an object with a ``video`` key (and at
    most an ``fps`` beside it)."""
    return isinstance(value, Mapping) and "video" in value and set(value) <= {"video", "fps"}


def decode_video(
    value: Mapping[str, Any], field: str, limits: VideoLimits = VideoLimits(), images: ImageLimits = ImageLimits(),
) -> list[Image.Image]:
    """The frames of a field's video, RGB, in time order (the module's text says which).

    Raises:
        ImageRejected: ``invalid_image`` or ``image_too_large`` naming the field.
    """
    import av  # PyAV: FFmpeg's decoders; imported when a video comes

    text, fps = value.get("video"), value.get("fps")
    fps = limits.fps if fps is None else fps
    if not isinstance(text, str):
        raise ImageRejected("invalid_image", field, f"\"video\" must be a base64 string, got {type(text).__name__}")
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not math.isfinite(fps) or fps <= 0:
        raise ImageRejected("invalid_image", field, "\"fps\" must be a positive number of frames per second")
    if len(text) // 4 * 3 > limits.max_bytes + 3:
        raise ImageRejected("image_too_large", field, f"about {len(text) // 4 * 3} bytes encoded; at most {limits.max_bytes}")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRejected("invalid_image", field, "the video is not valid base64") from None
    frames: list[Image.Image] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise ImageRejected("invalid_image", field, "the data holds no video stream")
            stream = container.streams.video[0]
            w, h = stream.codec_context.width, stream.codec_context.height
            if w * h > images.max_pixels:
                raise ImageRejected("image_too_large", field, f"{w}×{h} pixels a frame; at most {images.max_pixels}")
            for frame in container.decode(stream):
                if frame.time is None or frame.time < len(frames) / fps - 1e-9:
                    continue
                frames.append(frame.to_image())  # rgb24
                if len(frames) == limits.max_frames:
                    break
    except ImageRejected:
        raise
    except Exception:  # FFmpeg cannot open or decode it
        raise ImageRejected("invalid_image", field, "the bytes are not a video FFmpeg decodes") from None
    if not frames:
        raise ImageRejected("invalid_image", field, "the video has no frame")
    if min(frames[0].size) < images.min_side:
        raise ImageRejected("invalid_image", field, f"{frames[0].size[0]}×{frames[0].size[1]} pixels a frame; each side "
                            f"needs at least {images.min_side}")
    return [f.convert("RGB") for f in frames]
