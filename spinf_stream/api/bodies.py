"""Request and response bodies of the HTTP API (pydantic; FastAPI builds ``/openapi.json`` from
them). Errors have OpenAI's shape: ``{"error": {"type", "message", "param"}}``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


def lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """Where a JSON value holds a string with a lone surrogate (``"\\ud800"``: valid JSON, not
    Unicode text, which no tokenizer reads): a dotted path, ``None`` when nowhere."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = lone_surrogate_at(key, path or "body") if isinstance(key, str) else None
        where = where or lone_surrogate_at(item, f"{path}.{key}" if path else str(key))
        if where:
            return where
    return None


class RequestBody(BaseModel):
    """A request body: unknown fields refused, every string Unicode text (no lone surrogate)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _unicode_text(cls, data: Any) -> Any:
        where = lone_surrogate_at(data)
        if where:
            raise ValueError(f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape): not Unicode text")
        return data


class ScoreRequest(RequestBody):
    """``POST /v1/score``: score ``messages`` against ``pack``."""

    model_config = ConfigDict(extra="forbid")
    pack: str | dict[str, Any] = Field(
        description="A pack this server serves (GET /v1/packs), by name or name@version; or a pack given inline, its YAML "
        "as a JSON object (for authoring; uncalibrated; off with --no-api-inline-packs).")
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


# -- item scoring (SGLang's /v1/score, vLLM's /v1/generative-scores) ---------------------------

TokenIds = list[int]


class ItemScoreRequest(RequestBody):
    """``POST /v1/score`` in SGLang's shape: the probability of each ``label_token_ids`` token
    right after ``query + item`` (``item + query`` with ``item_first``), for each item. Text is
    tokenized whole, with the tokenizer's special tokens; token ids are joined as given."""

    model_config = ConfigDict(extra="forbid")
    query: str | TokenIds = Field(description="Text, or token ids.")
    items: str | list[str] | list[TokenIds] = Field(description="Text(s), or lists of token ids (as the query).")
    label_token_ids: list[int] = Field(min_length=1, description="Token ids whose next-token probabilities are read.")
    apply_softmax: bool = Field(False, description="Normalise over the labels (softmax of their logits); "
                                "false: full-vocabulary probabilities.")
    item_first: bool = Field(False, description="Put each item before the query.")
    model: str | None = Field(None, description="A served model (GET /v1/models); default: the first.")


class ScoringUsage(BaseModel):
    """Tokens read: every prompt's tokens (``query + item``), none generated."""

    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int


class ItemScoreResponse(BaseModel):
    """SGLang's response: ``scores[item][label]``, in request order."""

    scores: list[list[float]]
    model: str
    usage: ScoringUsage
    object: Literal["scoring"] = "scoring"


class GenerativeScoreRequest(RequestBody):
    """``POST /v1/generative-scores``, vLLM's shape: as :class:`ItemScoreRequest`, with softmax over
    the labels on by default and ``add_special_tokens``; sampling fields are accepted at their
    scoring values only (greedy: temperature 0 or null, top_k 0, top_p 1)."""

    model_config = ConfigDict(extra="forbid")
    query: str | TokenIds
    items: str | list[str] | list[TokenIds]
    label_token_ids: list[int] = Field(min_length=1)
    apply_softmax: bool = True
    item_first: bool = False
    add_special_tokens: bool = True
    model: str | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    priority: int = 0
    request_id: str | None = None


class GenerativeScoreItem(BaseModel):
    index: int
    token_probs: dict[str, float] = Field(description="Label token id (as a string) -> probability.")


class GenerativeScoreResponse(BaseModel):
    id: str
    object: Literal["generative_score"] = "generative_score"
    created: int
    model: str
    results: list[GenerativeScoreItem]
    usage: ScoringUsage


# -- OpenAI's /v1/completions -----------------------------------------------------------------


class CompletionRequest(RequestBody):
    """``POST /v1/completions``, OpenAI's legacy completions, read greedily: ``echo`` with
    ``logprobs`` gives every prompt token's log-probability (``max_tokens: 0`` scores only)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="A served model (GET /v1/models); default: the first.")
    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(description="A prompt or several: text or token ids.")
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, description="Alternatives per position (top-N), with the chosen token's.")
    max_tokens: int | None = Field(16, ge=0, description="Tokens to write greedily, at most 256 (0: score the prompt only).")
    temperature: float | None = Field(None, ge=0, description="0 (or unset): greedy; nothing is sampled.")
    top_p: float | None = None
    n: int | None = Field(1, ge=1)
    best_of: int | None = None
    stop: str | list[str] | None = Field(None, description="Up to 4 strings; the text ends before the first written.")
    stream: bool | None = False
    seed: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    suffix: str | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"]


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
