"""Requests read by a model without a pack (item scoring, completions): the lane whose model
serves them, limits checked before any compute, and the reads run on the engine thread
(:mod:`spinf_stream.engine.reads`), a request's work as engine calls of its own (a completion's
as one per forward pass), in turn with the stream's batches and other requests.

The number of prompts waiting is bounded: a request that would pass ``max_queued`` is refused
with :class:`~spinf_stream.api.scoring.QueueFull` (HTTP 429). With telemetry, each request's
engine call is a ``spinf.api.batch`` span linked to the request's span, and each of its prompts
waited ``spinf.api.queue.duration`` (from the request's call to the engine thread starting it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator, Sequence
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

    async def run(self, lane: Lane, n_prompts: int, fn: Callable[..., R | Generator[None, None, R]], *args: Any) -> R:
        """``fn(decoder, *args)`` on the engine thread with ``lane``'s decoder (loaded if need be).
        When ``fn`` returns a generator, each of its steps is an engine call of its own, queued
        behind whatever was submitted meanwhile (stream batches, other requests), so a long read
        never holds the engine for its whole length; its return value is the result.
        Raises :class:`QueueFull`. Cancelling the call drops the steps that have not started."""
        if self._queued + n_prompts > self.max_queued:
            raise QueueFull(f"{self._queued} prompts are queued; {n_prompts} more would pass the bound of {self.max_queued}")
        self._queued += n_prompts
        t = self.telemetry
        call = _Call(t, t.request_context() if t is not None else None, time.monotonic(), n_prompts, lane.model)
        try:
            done, value = await self.engine_thread.run(call.start, lane.scorer, fn, *args)
            while not done:
                done, value = await self.engine_thread.run(call.step)
            return value  # type: ignore[return-value]
        finally:
            self._queued -= n_prompts
            if not call.finished:  # cancelled (a timeout, a closed connection) with steps left
                try:
                    self.engine_thread.submit(call.close)  # on the engine thread: a step may be running
                except RuntimeError:  # the engine thread is closed: nothing runs the steps any more
                    pass


class _Call:
    """A request's engine work on the engine thread, step by step, reported: one
    ``spinf.api.batch`` span from its first step to its last."""

    def __init__(self, telemetry: Any, request: Any, queued_at: float, n_prompts: int, model: str) -> None:
        self.telemetry, self.request, self.queued_at, self.n_prompts, self.model = telemetry, request, queued_at, n_prompts, model
        self.steps: Generator[None, None, Any] | None = None
        self.span: Any = None
        self.finished = False

    def start(self, scorer: Any, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        t = self.telemetry
        if t is not None:
            waited = time.monotonic() - self.queued_at
            self.span = reported("api_batch_started", t.api_batch_started, [waited] * self.n_prompts, [self.request],
                                 model=self.model)
        try:
            out = fn(scorer.loaded_decoder(), *args)
        except BaseException:
            self.close()
            raise
        if not isinstance(out, Generator):
            self.close()
            return True, out
        self.steps = out
        return self.step()

    def step(self) -> tuple[bool, Any]:
        assert self.steps is not None
        try:
            next(self.steps)
        except StopIteration as done:
            self.close()
            return True, done.value
        except BaseException:
            self.close()
            raise
        return False, None

    def close(self) -> None:
        """End the span and drop the steps not run (idempotent)."""
        if self.finished:
            return
        self.finished = True
        if self.steps is not None:
            self.steps.close()
        if self.telemetry is not None:
            reported("api_batch_finished", self.telemetry.api_batch_finished, self.span)


def tokens_of(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    """``text`` tokenized whole, as transformers does (with the tokenizer's special tokens)."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
