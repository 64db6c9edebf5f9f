"""Output records of the engine (score and error records) and their digest.

The JSON shapes here are the product's contract: ``schemas/*.schema.json`` are generated from
these models (``python -m spinf_stream.schemas`` rewrites them; a test keeps them in sync).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema


def _optional(schema: dict[str, Any]) -> None:
    """An optional field is absent, never null: its schema has no ``default``."""
    schema.pop("default", None)


class PackRef(BaseModel):
    """Which pack produced a record, and how it read the message's fields."""

    model_config = ConfigDict(extra="forbid")
    name: str
    version: str
    special_tokens_in_fields: Literal["plain", "parse"] = Field(
        description="How special-token text in the message's fields was tokenized: the pack's "
        "special_tokens_in_fields or the --special-tokens-in-fields override (plain: ordinary text; "
        "parse: control tokens). The two give different scores for such text.",
    )


class NumericsRef(BaseModel):
    """What decides a record's bits besides the model, the device and the dtype: digests are
    comparable, and equal by construction, between records whose ``model`` blocks (this one
    included) are equal."""

    model_config = ConfigDict(extra="forbid")
    isa: str = Field(description="Instruction-set class of the CPU kernels (avx512, avx2, ...) or the CUDA architecture (sm_90).")
    library: str = Field(description="Kernel libraries and their versions: torch and its BLAS with the code path it picked, or Triton.")
    tiles: str = Field(description="The fixed shapes the pass is computed in (row chunks, tiles).")
    bits_probe: Literal["passed", "failed", "not_needed", "not_run"] = Field(
        description="The check at load that the BLAS computes a row on its own and alike on every worker: passed; "
        "failed (scored anyway, as --allow-unstable-bits asked: digests may differ with the batch); not_needed (no "
        "vendor library decides a row's bits: the Triton kernels); not_run.",
    )


class ModelRef(BaseModel):
    """Which model produced a record, and how it ran.

    A score from the CPU in float32 and one from a GPU in bfloat16 agree to a few decimals, not in
    their bits: ``device`` and ``dtype`` (with ``kernels`` and ``numerics``) say which one a
    digest belongs to.
    """

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="The --model reference: a short name (e.g. qwen2.5-coder-0.5b) or the path given.")
    sha256: str | None = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the weights' source bytes (the GGUF file, or a directory's config.json and "
        "*.safetensors in name order); null when the engine was built from tensors in memory.",
    )
    device: Literal["cpu", "cuda"]
    dtype: Literal["float32", "bfloat16", "float16", "fp8", "int8"] = Field(
        description="Weights and activations (fp8, int8: linear weights quantized per output channel, the rest bfloat16).",
    )
    kernels: Literal["torch", "triton", "cublas"] = Field(
        description="torch ops, the project's Triton kernels, or (SPINF_KERNELS=cublas, not batch-invariant) "
        "cuBLAS GEMMs with the Triton kernels elsewhere.",
    )
    numerics: NumericsRef


class ChoiceScore(BaseModel):
    """One choice of one question.

    ``logprob``: sum over the choice's tokens of the full-vocabulary log-probability (natural log)
    of each token given everything before it (with the question's ``choice_scoring`` ``mean``:
    that sum divided by the number of tokens; ``first_token``: the first token's alone). ``floor`` = ``exp(logprob)``, the unnormalised
    probability mass (a lower bound on the model's belief). ``probability`` = softmax of the
    question's choice logprobs (sums to 1 over the question's choices). ``calibrated``: the
    probability after the record's calibration (present only when one applies to the question;
    see ``spinf_stream.calibration``).
    """

    model_config = ConfigDict(extra="forbid")
    probability: float = Field(ge=0.0, le=1.0)
    logprob: float = Field(le=0.0)
    floor: float = Field(ge=0.0, le=1.0)
    calibrated: Annotated[float, Field(ge=0.0, le=1.0)] | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda v: v is None, json_schema_extra=_optional,
        description="Probability after calibration (sums to 1 over the question's choices); absent without one.",
    )


class QuestionScore(BaseModel):
    """Scores of one question: the answer and every choice's numbers.

    ``answer`` is the most probable choice, or with a calibration the most probable by
    ``calibrated``, or, for a binary question whose calibration has a threshold, the first choice
    iff its calibrated probability reaches ``threshold`` (the record then carries ``threshold``
    and ``rule``).
    """

    model_config = ConfigDict(extra="forbid")
    answer: str
    choices: dict[str, ChoiceScore]
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda v: v is None, json_schema_extra=_optional,
        description="The calibration's decision threshold on the first choice's calibrated probability; absent when "
        "the answer is the most probable choice.",
    )
    choice_scoring: Literal["mean", "first_token"] | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda v: v is None, json_schema_extra=_optional,
        description="How the choices' logprob was read when not summed over their tokens (the pack's choice_scoring): "
        "mean (divided by the choice's token count) or first_token (its first token's alone); absent for sum.",
    )
    rule: str | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda v: v is None, json_schema_extra=_optional,
        description="How the answer was decided when it is not the most probable choice, e.g. "
        "'yes if calibrated[yes] >= 0.240 (recall=0.95 on spam@1.3.0 rows)'; absent otherwise.",
    )
    view: Annotated[str, Field(pattern=r"^(whole|prefix:[0-9]+|suffix:[0-9]+)$")] | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda v: v is None, json_schema_extra=_optional,
        description="For a question the pack's views decide: the read whose first choice led most, whose numbers "
        "these are: whole (the message), prefix:N (the field's first N chars) or suffix:N (from char N); absent "
        "for other questions.",
    )


class ExtractionScore(BaseModel):
    """What the model wrote for an extraction (``kind`` text, number, money) or generation
    question: greedy decoding over the tokens the kind allows at each step (docs/extraction.md).

    ``probability``: the product over the emitted tokens (the stop token included when one ended
    the value) of each step's softmax renormalised over the allowed tokens. ``logprob``: the sum
    over the same tokens of the full-vocabulary log-probabilities (natural log).
    ``none_probability``: at the first step, the renormalised probability of the tokens that begin
    the pack's none word (``null`` when the question has none). ``tokens``: tokens of the value
    (without the stop token). ``min_token_probability``: the smallest renormalised step
    probability. With a calibration of the question (its none map): ``none_calibrated``, and
    the answer is none or a value by the map's decision at the first step; a none so decided is
    written as no token (``tokens`` 0, ``probability`` = ``none_probability``, ``logprob`` the log
    of the none-word tokens' full-vocabulary mass), a value never begins with the none word.
    """

    model_config = ConfigDict(extra="forbid")
    kind: Literal["text", "number", "money", "generate"]
    answer: str | None = Field(description="The text as written (leading spaces dropped), or null when the model wrote the none word.")
    value: float | str | None = Field(description="number and money: the amount as a number; text and generate: the text; null for none or a value left unfinished at max_tokens.")
    currency: str | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda v: v is None, json_schema_extra=_optional,
        description="money only: the ISO 4217 code the text determines (the pack's currency_default for $ and dollars); absent otherwise.",
    )
    probability: float = Field(ge=0.0, le=1.0)
    logprob: float = Field(le=0.0)
    none_probability: Annotated[float, Field(ge=0.0, le=1.0)] | None
    tokens: int = Field(ge=0)
    min_token_probability: float = Field(ge=0.0, le=1.0)
    none_calibrated: Annotated[float, Field(ge=0.0, le=1.0)] | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda v: v is None, json_schema_extra=_optional,
        description="The calibrated probability that the message holds no such value (the record's calibration "
        "decided none or a value by it at the first step); absent without a calibration of this question.",
    )


class ScoreRecord(BaseModel):
    """The score record of one message (one output line / one Kafka record value)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    pack: PackRef
    model: ModelRef
    scores: dict[str, QuestionScore | ExtractionScore]
    calibration: str | SkipJsonSchema[None] = Field(
        None, exclude_if=lambda v: v is None, json_schema_extra=_optional,
        description="Id of the calibration applied (see spinf_stream.calibration); absent without one.",
    )
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="sha256 of the canonical score bytes, see records.digest")


class ErrorInfo(BaseModel):
    """Why a message could not be scored. ``kind`` is machine-readable (snake_case)."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    message: str


class ErrorRecord(BaseModel):
    """Takes a bad input line's place in the offline output."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    error: ErrorInfo


def canonical_score_bytes(scores: dict[str, Any]) -> bytes:
    """Canonical bytes of a ``scores`` mapping: orjson with sorted keys, no whitespace.

    JSON floats are written as the shortest string that round-trips the float64, so equal bytes
    mean bitwise-equal numbers.
    """
    return orjson.dumps(scores, option=orjson.OPT_SORT_KEYS)


def digest(scores: dict[str, Any]) -> str:
    """``"sha256:" + hex`` of :func:`canonical_score_bytes` of the plain-JSON ``scores``.

    A user verifies a record with ``sha256(orjson.dumps(record["scores"], option=OPT_SORT_KEYS))``.
    """
    return "sha256:" + hashlib.sha256(canonical_score_bytes(scores)).hexdigest()


#: schema file name → model, for ``schemas/`` (the stream's own records live in ``stream.records``)
SCHEMAS: dict[str, type[BaseModel]] = {
    "score.schema.json": ScoreRecord,
    "error.schema.json": ErrorRecord,
}


def record_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schemas (draft 2020-12) of the engine's records, by file name."""
    return {
        name: {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema()}
        for name, model in SCHEMAS.items()
    }

