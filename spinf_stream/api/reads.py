"""Requests read by a model without a pack (item scoring, completions): the lane whose model
serves them, limits checked before any compute, and the reads run on the engine thread
(:mod:`spinf_stream.engine.reads`), one request per engine call, in turn with the stream's batches.

The number of prompts waiting is bounded: a request that would pass ``max_queued`` is refused
with :class:`~spinf_stream.api.scoring.QueueFull` (HTTP 429). With telemetry, each request's
engine call is a ``spinf.api.batch`` span linked to the request's span, and each of its prompts
waited ``spinf.api.queue.duration`` (from the request's call to the engine thread starting it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from spinf_stream.api.scoring import BadRequest, Lane, QueueFull, UnknownLane, reported
from spinf_stream.stream.engine_thread import EngineThread

R = TypeVar("R")

__all__ = ["BadRequest", "ModelReads", "tokens_of"]


class ModelReads:
    """Runs reads of ``lanes``' models on ``engine_thread``.

    Args:
        lanes: the served lanes (their models; the pack is not used).
        token_budget: tokens a request's prompts may hold in all (at least the model's context).
        max_queued: prompts waiting at most.
        telemetry: where engine calls are reported (``StreamTelemetry``; ``None``: nowhere).
    """

    def __init__(self, lanes: Sequence[Lane], engine_thread: EngineThread, *, token_budget: int, max_queued: int = 4096,
                 telemetry: Any = None) -> None:
        self.models: dict[str, Lane] = {}
        for lane in lanes:
            self.models.setdefault(lane.model, lane)
        self.engine_thread = engine_thread
        self.token_budget = token_budget
        self.max_queued = max_queued
        self.telemetry = telemetry
        self._queued = 0

    def lane_for(self, model: str | None) -> Lane:
        """The first lane of ``model`` (``None``: the first served). Raises :class:`UnknownLane`."""
        if model is None:
            return next(iter(self.models.values()))
        if model not in self.models:
            raise UnknownLane("model", f"model {model!r} is not served here; served: {', '.join(self.models)}")
        return self.models[model]

    def check_tokens(self, lane: Lane, prompts: Sequence[Sequence[int]], param: str) -> None:
        """Raise :class:`BadRequest` for an empty prompt, one over the model's context, a token id
        outside the vocabulary, or prompts over the request's token bound."""
        context = int(lane.scorer.max_positions)
        vocab = len(lane.scorer.tokenizer)
        for i, p in enumerate(prompts):
            where = f"{param}[{i}]" if len(prompts) > 1 else param
            if not p:
                raise BadRequest(where, f"{where} has no tokens")
            if len(p) > context:
                raise BadRequest(where, f"{where} is {len(p)} tokens; the model's context is {context}")
            bad = next((t for t in p if not 0 <= t < vocab), None)
            if bad is not None:
                raise BadRequest(where, f"{where} holds token id {bad}, outside the vocabulary (0..{vocab - 1})")
        total = sum(len(p) for p in prompts)
        bound = max(self.token_budget, context)
        if total > bound:
            raise BadRequest(param, f"the request's prompts hold {total} tokens; at most {bound} per request")

    async def run(self, lane: Lane, n_prompts: int, fn: Callable[..., R], *args: Any) -> R:
        """``fn(decoder, *args)`` on the engine thread with ``lane``'s decoder (loaded if need be).
        Raises :class:`QueueFull`. Cancelling the call drops it if it has not started."""
        if self._queued + n_prompts > self.max_queued:
            raise QueueFull(f"{self._queued} prompts are queued; {n_prompts} more would pass the bound of {self.max_queued}")
        self._queued += n_prompts
        t = self.telemetry
        call = _Call(t, t.request_context() if t is not None else None, time.monotonic(), n_prompts, lane.model)
        try:
            return await self.engine_thread.run(call, lane.scorer, fn, *args)
        finally:
            self._queued -= n_prompts


class _Call:
    """A request's engine call: ``fn(decoder, *args)`` on the engine thread, reported."""

    def __init__(self, telemetry: Any, request: Any, queued_at: float, n_prompts: int, model: str) -> None:
        self.telemetry, self.request, self.queued_at, self.n_prompts, self.model = telemetry, request, queued_at, n_prompts, model

    def __call__(self, scorer: Any, fn: Callable[..., R], *args: Any) -> R:
        t = self.telemetry
        span = None
        if t is not None:
            waited = time.monotonic() - self.queued_at
            span = reported("api_batch_started", t.api_batch_started, [waited] * self.n_prompts, [self.request], model=self.model)
        try:
            return fn(scorer.loaded_decoder(), *args)
        finally:
            if t is not None:
                reported("api_batch_finished", t.api_batch_finished, span)


def tokens_of(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    """``text`` tokenized whole, as transformers does (with the tokenizer's special tokens)."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
