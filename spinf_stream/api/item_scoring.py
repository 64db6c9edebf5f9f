"""Item scoring in SGLang's shape (``POST /v1/score`` with ``query`` and ``items``) and vLLM's
(``POST /v1/generative-scores``): each item's prompt is ``query + item`` (``item + query`` with
``item_first``), text tokenized whole as transformers does, token ids joined as given; the
prompts are one tree (their shared tokens read once, :func:`spinf_stream.engine.reads.label_logprobs`).

A score is ``exp(logprob)`` of each label token after the prompt over the full vocabulary, or
with ``apply_softmax`` the softmax of the labels' logits (equal to the softmax of their
full-vocabulary log-probabilities). The two shapes differ in defaults (SGLang: no softmax; vLLM:
softmax, ``add_special_tokens``) and in the response (SGLang: ``scores[item][label]``; vLLM:
``results[item].token_probs{label id: p}``).
"""

from __future__ import annotations

import asyncio

import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

from spinf_stream.api.bodies import (
    GenerativeScoreItem, GenerativeScoreRequest, GenerativeScoreResponse, ItemScoreRequest, ItemScoreResponse, ScoringUsage,
)
from spinf_stream.api.reads import BadRequest, ModelReads, tokens_of
from spinf_stream.engine.reads import LabelRequest, label_logprobs
from spinf_stream.softmax import softmax_row


def item_prompts(tokenizer: Any, query: str | list[int], items: str | list[str] | list[list[int]],
                 item_first: bool, add_special_tokens: bool = True) -> list[list[int]]:
    """Each item's prompt as token ids. Raises :class:`BadRequest` for text mixed with token ids or no items."""
    listed: list[Any] = [items] if isinstance(items, str) else list(items)
    if not listed:
        raise BadRequest("items", "items is empty: give at least one item")
    if isinstance(query, str):
        if not all(isinstance(i, str) for i in listed):
            raise BadRequest("items", "the query is text, so the items must be text too")
        texts = [i + query if item_first else query + i for i in listed]
        return [tokens_of(tokenizer, t, add_special_tokens) for t in texts]
    if not all(isinstance(i, list) for i in listed):
        raise BadRequest("items", "the query is token ids, so the items must be lists of token ids too")
    return [list(i) + list(query) if item_first else list(query) + list(i) for i in listed]


def probabilities(logprobs: Sequence[float], apply_softmax: bool) -> list[float]:
    """Per label: ``exp(logprob)``, or normalised over the labels (:func:`~spinf_stream.softmax.softmax_row`)."""
    return softmax_row(logprobs) if apply_softmax else [math.exp(x) for x in logprobs]


async def _read(reads: ModelReads, model: str | None, query: Any, items: Any, labels: list[int], item_first: bool,
                add_special_tokens: bool) -> tuple[str, list[list[float]], int]:
    lane = reads.lane_for(model)
    tok = lane.scorer.tokenizer
    vocab = len(tok)
    bad = next((t for t in labels if not 0 <= t < vocab), None)
    if bad is not None:
        raise BadRequest("label_token_ids", f"label token id {bad} is outside the vocabulary (0..{vocab - 1})")
    prompts = await asyncio.to_thread(item_prompts, tok, query, items, item_first, add_special_tokens)  # off the event loop
    reads.check_tokens(lane, prompts, "items")
    request = LabelRequest(tuple(tuple(p) for p in prompts), tuple(labels))
    (per_item,) = await reads.run(lane, len(prompts), label_logprobs, [request], reads.token_budget)
    return lane.model, per_item, sum(len(p) for p in prompts)


async def score_items(reads: ModelReads, body: ItemScoreRequest) -> ItemScoreResponse:
    """SGLang's ``/v1/score``."""
    model, per_item, n = await _read(reads, body.model, body.query, body.items, body.label_token_ids, body.item_first, True)
    return ItemScoreResponse(scores=[probabilities(lp, body.apply_softmax) for lp in per_item], model=model,
                             usage=ScoringUsage(prompt_tokens=n, total_tokens=n))


async def generative_scores(reads: ModelReads, body: GenerativeScoreRequest) -> GenerativeScoreResponse:
    """vLLM's ``/v1/generative-scores``. Raises :class:`BadRequest` for sampling parameters."""
    if body.temperature not in (None, 0) or body.top_k not in (None, 0) or body.top_p not in (None, 1):
        raise BadRequest("temperature", "scores are read greedily: temperature 0, top_k 0 and top_p 1 only")
    model, per_item, n = await _read(reads, body.model, body.query, body.items, body.label_token_ids, body.item_first,
                                     body.add_special_tokens)
    results = [GenerativeScoreItem(index=i, token_probs={str(t): p for t, p in zip(body.label_token_ids,
                                                                                    probabilities(lp, body.apply_softmax))})
               for i, lp in enumerate(per_item)]
    return GenerativeScoreResponse(id=body.request_id or f"genscore-{uuid.uuid4().hex}", created=int(time.time()), model=model,
                                   results=results, usage=ScoringUsage(prompt_tokens=n, total_tokens=n))
