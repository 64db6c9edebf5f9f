"""The JSON Schema of an input message (``schemas/message.schema.json``), for the people and
tools that write to the input topic. Decoding follows :mod:`spinf_stream.messages`, pictures
:mod:`spinf_stream.images` and videos :mod:`spinf_stream.video`; this module only describes them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

__all__ = ["input_schemas"]


class ImageValue(BaseModel):
    """A picture: PNG, JPEG or WebP bytes, base64 (RFC 4648, padded)."""

    model_config = ConfigDict(extra="forbid")
    image: str = Field(description="The encoded picture, base64.")


class VideoValue(BaseModel):
    """An MP4/MOV or WebM/Matroska video, base64: the frames at or after each k / fps seconds
    are read, at most 8, each as a picture."""

    model_config = ConfigDict(extra="forbid")
    video: str = Field(description="The encoded video, base64.")
    fps: float | None = Field(None, gt=0, description="Frames per second taken (default 1).")


class FieldValue(RootModel[str | ImageValue | VideoValue | list[ImageValue]]):
    """A field the pack's prompt uses: text; a picture (an object, or a ``data:image/<png|jpeg|webp>;base64,``
    URL as the string); a video; or a video's frames as an array of pictures. Pictures need a
    model that reads them (a Gemma 3 multimodal checkpoint)."""


class InputMessage(BaseModel):
    """A message on the input topic (``--input-format json``), a line of ``spinf-stream score``'s
    input, or one of ``/v1/score``'s ``messages``: its fields by name, and an optional ``id``.
    Each field the pack's prompt uses holds a ``FieldValue``; other members are not read."""

    model_config = ConfigDict(extra="allow", title="InputMessage")
    id: str | int | None = Field(None, description="The message id (default: where it came from).")


def input_schemas() -> dict[str, dict[str, Any]]:
    """``message.schema.json``: the input message with its field values."""
    schema = InputMessage.model_json_schema()
    defs = schema.setdefault("$defs", {})
    field = FieldValue.model_json_schema()
    defs.update(field.pop("$defs", {}))
    defs["FieldValue"] = field
    return {"message.schema.json": schema}
