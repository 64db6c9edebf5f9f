"""OpenAI's legacy ``POST /v1/completions``, read greedily: with ``echo`` and ``logprobs`` every
prompt token's log-probability (how lm-evaluation-harness and classification-by-logprob code
score choices), and up to ``max_tokens`` written tokens, each the most likely (ties to the
lowest id), as transformers' ``generate(do_sample=False)`` writes them.

A text prompt is tokenized whole with the tokenizer's special tokens; token ids are read as
given. The request's prompts are read in one engine call: their echo as one trie
(:func:`spinf_stream.engine.reads.prompt_logprobs`), their completions with the shared prefix
read once and one decode step per written token, keys/values kept
(:func:`spinf_stream.engine.reads.complete`). A completion ends before the end-of-text token or
at the first stop string (the text is cut before it; the token holding it is counted, as vLLM
does). ``tokens`` are each token decoded alone, ``text_offset`` their character offsets in the
returned text's decoded pieces, and ``top_logprobs[i]`` the top ``logprobs`` tokens at position i
with the chosen token's (OpenAI's "the most likely tokens, as well as the chosen tokens").
"""

from __future__ import annotations

import asyncio

import time
import uuid
from collections.abc import Callable, Generator
from typing import Any

from spinf_stream.api.bodies import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, CompletionUsage
from spinf_stream.api.reads import BadRequest, ModelReads, tokens_of
from spinf_stream.engine.reads import Completion, CompletionSpec, PromptLogprobs, complete_steps, prompt_logprobs
from spinf_stream.packs.pack import MAX_TOKENS_LIMIT

#: tokens written per prompt at most (a pack's extraction bound,
#: :data:`spinf_stream.packs.pack.MAX_TOKENS_LIMIT`)
MAX_WRITTEN = MAX_TOKENS_LIMIT
#: stop strings per request at most (OpenAI's bound)
MAX_STOPS = 4


def prompts_of(tokenizer: Any, prompt: str | list[str] | list[int] | list[list[int]]) -> list[tuple[str | None, list[int]]]:
    """The request's prompts: each its text (``None`` for token ids) and its token ids. Raises
    :class:`BadRequest` for an empty list."""
    if isinstance(prompt, str):
        return [(prompt, tokens_of(tokenizer, prompt))]
    if not prompt:
        raise BadRequest("prompt", "prompt is an empty list")
    if all(isinstance(p, int) for p in prompt):
        return [(None, list(prompt))]  # type: ignore[arg-type]
    return [(p, tokens_of(tokenizer, p)) if isinstance(p, str) else (None, list(p)) for p in prompt]  # type: ignore[union-attr]


def check(body: CompletionRequest, max_logprobs: int) -> int:
    """The tokens to write; raises :class:`BadRequest` for what is not served."""
    written = 16 if body.max_tokens is None else body.max_tokens
    if body.temperature not in (None, 0):
        raise BadRequest("temperature", "only greedy reads are served: temperature must be 0 (nothing is sampled)")
    if written > MAX_WRITTEN:
        raise BadRequest("max_tokens", f"max_tokens {written}: this server writes at most {MAX_WRITTEN} tokens per prompt "
                         "(0 scores the prompt alone; OpenAI's default is 16)")
    if body.logprobs is not None and body.logprobs > max_logprobs:
        raise BadRequest("logprobs", f"logprobs {body.logprobs}: at most {max_logprobs} (the server's --api-max-logprobs)")
    for name, value, ok in (("n", body.n, (None, 1)), ("best_of", body.best_of, (None, 1)), ("stream", body.stream, (None, False)),
                            ("suffix", body.suffix, (None, "")), ("top_p", body.top_p, (None, 1))):
        if value not in ok:
            raise BadRequest(name, f"{name} {value!r} is not served (greedy, one choice per prompt, no streaming)")
    for name in ("logit_bias", "presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise BadRequest(name, f"{name} is not served: reads are the model's own")
    if isinstance(body.stop, list) and len(body.stop) > MAX_STOPS:
        raise BadRequest("stop", f"stop holds {len(body.stop)} strings; at most {MAX_STOPS}, as OpenAI's")
    return written


def _piece(tokenizer: Any, token: int) -> str:
    return str(tokenizer.decode([token]))


def _choice(tokenizer: Any, index: int, text: str | None, prompt: list[int], read: PromptLogprobs | None,
            written: Completion | None, body: CompletionRequest) -> CompletionChoice:
    out_tokens: list[int] = []
    out_lps: list[float | None] = []
    out_tops: list[tuple[tuple[int, float], ...] | None] = []
    if read is not None:  # echo with logprobs
        out_tokens += read.tokens
        out_lps += read.token_logprobs
        out_tops += read.top
    completion, finish = "", "length"
    if written is not None:
        completion, finish = written.text, written.finish_reason
        out_tokens += written.ids
        out_lps += written.logprobs
        out_tops += written.top if body.logprobs else [()] * len(written.ids)
    prompt_text = text if text is not None else str(tokenizer.decode(prompt))
    full = (prompt_text if body.echo else "") + completion
    logprobs = None
    if body.logprobs is not None:
        pieces = [_piece(tokenizer, t) for t in out_tokens]
        offsets, at = [], 0
        for p in pieces:
            offsets.append(at)
            at += len(p)
        tops: list[dict[str, float] | None] = []
        for tok, lp, top in zip(out_tokens, out_lps, out_tops):
            if top is None:
                tops.append(None)
                continue
            entry = {_piece(tokenizer, i): v for i, v in top}
            if lp is not None:  # the chosen token's own value, also where pieces collide (partial UTF-8 decodes to "\ufffd")
                entry[_piece(tokenizer, tok)] = lp
            tops.append(entry)
        logprobs = CompletionLogprobs(tokens=pieces, token_logprobs=out_lps, top_logprobs=tops, text_offset=offsets)
    return CompletionChoice(index=index, text=full, logprobs=logprobs, finish_reason=finish)


def _read(decoder: Any, prompts: list[list[int]], echo_top_n: int | None, spec: CompletionSpec | None,
          eos: list[int], decode: Callable[[list[int]], str], token_budget: int,
          ) -> Generator[None, None, tuple[list[PromptLogprobs] | None, list[Completion] | None]]:
    """The request's engine work, in steps (:meth:`~spinf_stream.api.reads.ModelReads.run` runs
    other work between them): its prompts' logprobs (``echo_top_n`` not ``None``), then their
    greedy completions (``spec`` not ``None``), a step per forward pass."""
    echoed = None if echo_top_n is None else prompt_logprobs(decoder, prompts, echo_top_n, token_budget)
    written = None
    if spec is not None:
        yield
        written = yield from complete_steps(decoder, prompts, spec, eos, decode, token_budget)
    return echoed, written


async def complete_request(reads: ModelReads, body: CompletionRequest, max_logprobs: int) -> CompletionResponse:
    """OpenAI's completions over the request's prompts. Raises :class:`BadRequest`,
    :class:`~spinf_stream.api.scoring.UnknownLane`, :class:`~spinf_stream.api.scoring.QueueFull`."""
    n_write = check(body, max_logprobs)
    lane = reads.lane_for(body.model)
    tok = lane.scorer.tokenizer
    texts, prompts = zip(*await asyncio.to_thread(prompts_of, tok, body.prompt))  # off the event loop
    reads.check_tokens(lane, prompts, "prompt")
    context = int(lane.scorer.max_positions)
    for i, p in enumerate(prompts):
        if len(p) + n_write > context:
            where = f"prompt[{i}]" if len(prompts) > 1 else "prompt"
            raise BadRequest("max_tokens", f"{where} is {len(p)} tokens and max_tokens {n_write}: together over the "
                             f"model's context of {context} tokens")
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    spec = CompletionSpec(n_write, tuple(s for s in stops if s), body.logprobs or 0) if n_write else None
    eos = [t for t in (tok.eos_token_id,) if t is not None]
    echo_top_n = (body.logprobs or 0) if body.echo and body.logprobs is not None else None
    echoed, written = await reads.run(lane, len(prompts), _read, [list(p) for p in prompts], echo_top_n, spec, eos,
                                      tok.decode, reads.token_budget)
    choices = [_choice(tok, i, text, list(p), echoed[i] if echoed else None, written[i] if written else None, body)
               for i, (text, p) in enumerate(zip(texts, prompts))]
    n_prompt = sum(len(p) for p in prompts)
    n_written = sum(len(c.ids) for c in written or ())
    return CompletionResponse(id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=lane.model, choices=choices,
                              usage=CompletionUsage(prompt_tokens=n_prompt, completion_tokens=n_written,
                                                    total_tokens=n_prompt + n_written))
