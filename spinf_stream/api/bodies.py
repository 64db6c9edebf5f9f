"""Request and response bodies of the HTTP API (pydantic; FastAPI builds ``/openapi.json`` from
them). Errors have OpenAI's shape: ``{"error": {"type", "message", "param"}}``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ScoreRequest(BaseModel):
    """``POST /v1/score``: score ``messages`` against ``pack``."""

    model_config = ConfigDict(extra="forbid")
    pack: str = Field(description="A pack this server serves (GET /v1/packs), by name or name@version.", min_length=1)
    model: str | None = Field(None, description="The model to read with (GET /v1/models); default: the first that serves the pack.")
    messages: list[dict[str, Any]] = Field(
        min_length=1, description="JSON objects with the pack's fields and an optional id (a string or an integer; "
        "default: the message's index in the list), as on the input topic.")
    calibration: str | None = Field(
        None, max_length=200, description="A calibration the server serves for the pack (serve: its --calibration, auto and none; "
        "run: the route's): auto is the pack's shipped one for the model, none raw probabilities. Default: the first served.")


class Usage(BaseModel):
    """Tokens of a request's scored messages: ``prompt_tokens`` their prompts (the pack's cached
    preamble, their content and question branches), ``computed_tokens`` what they cost the forward
    passes (the preamble is computed once per model, not per message; decode steps included)."""

    prompt_tokens: int
    computed_tokens: int


class ScoreResponse(BaseModel):
    """One record per message, in request order: a score record exactly as ``spinf-stream score``
    writes it (same ``scores`` and ``digest`` as on the scores topic, without ``source``), or an
    error record (``{"id", "error": {"kind", "message"}}``)."""

    records: list[dict[str, Any]]
    usage: Usage
    object: Literal["spinf.score"] = "spinf.score"


class PackQuestion(BaseModel):
    id: str
    choices: list[str]
    kind: str


class PackEntry(BaseModel):
    """A served pack."""

    name: str
    version: str
    fields: list[str]
    questions: list[PackQuestion]
    calibration: str | None = Field(description="The calibration the server applies by default (its source), or null.")


class PacksResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[PackEntry]


class ModelEntry(BaseModel):
    """A served model (OpenAI's ``/v1/models`` entry, with its load state)."""

    id: str
    object: Literal["model"] = "model"
    owned_by: str = "spinf-stream"
    loaded: bool
    sha256: str | None = None


class ModelsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


class ErrorDetail(BaseModel):
    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, "
                      "request_too_large, rate_limit_error, timeout_error or server_error.")
    message: str
    param: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
