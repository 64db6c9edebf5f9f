"""A message field holding a video → the frames the model reads, or the reason it has none.

A field holds a video as a JSON object ``{"video": "<base64>"}`` with an optional ``"fps"``
(frames per second to take, a positive number; default :attr:`VideoLimits.fps`). Containers:
MP4/MOV and WebM/Matroska (told by their first bytes, opened by name), any codec FFmpeg decodes
in them (H.264, MPEG-4 Part 2, VP8, VP9, AV1, ...), by PyAV; no frame over the pixel limit is
decoded, not even while FFmpeg probes the stream. Frames taken: for k = 0, 1, 2, ... the first decoded frame whose presentation time is at
or after ``k / fps`` seconds, the first :attr:`VideoLimits.max_frames` of them. Each is converted
to RGB by FFmpeg's ``rgb24`` conversion and read as a picture (:mod:`spinf_stream.images`).

A field may instead hold the frames themselves: a JSON array of images, in order.

Rejection kinds: ``invalid_image`` (not base64, not a video FFmpeg decodes, no frame, a bad
``fps``) and ``image_too_large`` (encoded bytes or frame pixels over a limit).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image

from .images import ImageLimits, ImageRejected, base64_payload

__all__ = ["VideoLimits", "decode_video", "is_video_value"]


@dataclass(frozen=True)
class VideoLimits:
    """What one video may be: ``max_bytes`` encoded, ``max_frames`` taken, ``fps`` taken by
    default (frames per second of video time)."""

    max_bytes: int = 64 * 1024 * 1024
    max_frames: int = 8
    fps: float = 1.0


def is_video_value(value: Any) -> bool:
    """Whether a field's JSON value is meant as a video: an object with a ``video`` key."""
    return isinstance(value, Mapping) and "video" in value


def container_format(data: bytes) -> str | None:
    """FFmpeg's demuxer for ``data`` by its first bytes: ``mp4`` (an ISO media file: MP4, MOV,
    their ``ftyp`` box at byte 4) or ``matroska`` (WebM, MKV: the EBML magic); ``None`` for
    anything else. Only these are opened, each by name: FFmpeg is never left to guess a format
    from the content (its ``concat`` and playlist formats open other files)."""
    if data[4:8] == b"ftyp":
        return "mp4"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    return None


def decode_video(
    value: Mapping[str, Any], field: str, limits: VideoLimits = VideoLimits(), images: ImageLimits = ImageLimits(),
    pixels_left: int | None = None,
) -> list[Image.Image]:
    """The frames of a field's video, RGB, in time order (the module's text says which).
    ``pixels_left``: what the message's pictures may still hold (frames count one by one).

    Raises:
        ImageRejected: ``invalid_image`` or ``image_too_large`` naming the field.
    """
    import av  # PyAV: FFmpeg's decoders; imported when a video comes

    extra = sorted(set(value) - {"video", "fps"})
    if extra:
        raise ImageRejected("invalid_image", field, f"a video object holds \"video\" and \"fps\" only, got {extra}")
    text, fps = value.get("video"), value.get("fps")
    fps = limits.fps if fps is None else fps
    if not isinstance(text, str):
        raise ImageRejected("invalid_image", field, f"\"video\" must be a base64 string, got {type(text).__name__}")
    try:
        ok = not isinstance(fps, bool) and isinstance(fps, int | float) and math.isfinite(float(fps)) and fps > 0
    except OverflowError:
        ok = False
    if not ok:
        raise ImageRejected("invalid_image", field, "\"fps\" must be a positive number of frames per second")
    data = base64_payload(text, field, limits.max_bytes, "video")
    fmt = container_format(data)
    if fmt is None:
        raise ImageRejected("invalid_image", field, "the bytes are not an MP4/MOV or WebM/Matroska video")
    left = images.max_pixels * limits.max_frames if pixels_left is None else pixels_left
    # FFmpeg's own bound: no frame over max_pixels is decoded, not even while probing the stream
    bound = {"max_pixels": str(images.max_pixels)}
    frames: list[Image.Image] = []
    try:
        with av.open(io.BytesIO(data), mode="r", format=fmt, stream_options=[bound] * 16) as container:
            if not container.streams.video:
                raise ImageRejected("invalid_image", field, "the data holds no video stream")
            stream = container.streams.video[0]
            w, h = stream.codec_context.width, stream.codec_context.height
            if w * h == 0:
                raise ImageRejected("image_too_large", field, f"its frames are not decoded within {images.max_pixels} "
                                    "pixels a frame")
            end = container.duration / 1e6 if container.duration else None  # seconds (AV_TIME_BASE)
            for frame in container.decode(stream):
                if frame.time is None or frame.time < len(frames) / fps - 1e-9:
                    continue
                left -= frame.width * frame.height
                if left < 0:
                    raise ImageRejected("image_too_large", field, "its frames hold more pixels than a message's "
                                        "pictures may")
                frames.append(frame.to_image())  # rgb24
                if len(frames) == limits.max_frames or (end is not None and len(frames) / fps > end):
                    break  # the next frame asked for lies past the video's end: decode no further
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
