"""OpenAI's legacy ``POST /v1/completions``, read greedily: with ``echo`` and ``logprobs`` every
prompt token's log-probability (how lm-evaluation-harness and classification-by-logprob code
score choices), and at most one written token (the most likely; ties to the lowest id).

A text prompt is tokenized whole with the tokenizer's special tokens; token ids are read as
given. The request's prompts are one trie (shared prefixes read once,
:func:`spinf_stream.engine.reads.prompt_logprobs`). ``tokens`` are each token decoded alone,
``text_offset`` their character offsets in the returned text's decoded pieces, and
``top_logprobs[i]`` the top ``logprobs`` tokens at position i with the chosen token's (OpenAI's
"the most likely tokens, as well as the chosen tokens").
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from spinf_stream.api.bodies import CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, CompletionUsage
from spinf_stream.api.reads import BadRequest, ModelReads, tokens_of
from spinf_stream.engine.reads import PromptLogprobs, prompt_logprobs

#: tokens this server writes at most (greedy, from the prompt's own read)
MAX_WRITTEN = 1


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
        raise BadRequest("max_tokens", f"max_tokens {written}: this server writes at most {MAX_WRITTEN} token "
                         "(set max_tokens to 0 to score the prompt, 1 for its most likely next token; OpenAI's default is 16)")
    if body.logprobs is not None and body.logprobs > max_logprobs:
        raise BadRequest("logprobs", f"logprobs {body.logprobs}: at most {max_logprobs} (the server's --api-max-logprobs)")
    for name, value, ok in (("n", body.n, (None, 1)), ("best_of", body.best_of, (None, 1)), ("stream", body.stream, (None, False)),
                            ("suffix", body.suffix, (None, "")), ("top_p", body.top_p, (None, 1))):
        if value not in ok:
            raise BadRequest(name, f"{name} {value!r} is not served (greedy, one choice per prompt, no streaming)")
    if body.logit_bias or body.presence_penalty or body.frequency_penalty:
        raise BadRequest("logit_bias", "logit_bias and penalties are not served: reads are the model's own")
    return written


def _piece(tokenizer: Any, token: int) -> str:
    return str(tokenizer.decode([token]))


def _choice(tokenizer: Any, index: int, text: str | None, read: PromptLogprobs, body: CompletionRequest, written: int,
            stops: list[str]) -> tuple[CompletionChoice, int]:
    out_tokens: list[int] = []
    out_lps: list[float | None] = []
    out_tops: list[tuple[tuple[int, float], ...] | None] = []
    if body.echo:
        out_tokens += read.tokens
        out_lps += read.token_logprobs
        out_tops += read.top
    completion, finish, n_written = "", "length", 0
    if written:
        t = read.next_token
        piece = _piece(tokenizer, t)
        stopped = t == tokenizer.eos_token_id or any(s and s in piece for s in stops)
        if stopped:
            finish = "stop"
            cut = min((piece.index(s) for s in stops if s and s in piece), default=0)
            completion = piece[:cut]
        else:
            completion = piece
        if not stopped or completion:
            n_written = 1
            out_tokens.append(t)
            out_lps.append(read.next_logprob)
            out_tops.append(read.next_top)
    prompt_text = text if text is not None else str(tokenizer.decode(list(read.tokens)))
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
            if lp is not None:
                entry.setdefault(_piece(tokenizer, tok), lp)
            tops.append(entry)
        logprobs = CompletionLogprobs(tokens=pieces, token_logprobs=out_lps, top_logprobs=tops, text_offset=offsets)
    return CompletionChoice(index=index, text=full, logprobs=logprobs, finish_reason=finish), n_written  # type: ignore[arg-type]


async def complete(reads: ModelReads, body: CompletionRequest, max_logprobs: int) -> CompletionResponse:
    """OpenAI's completions over the request's prompts. Raises :class:`BadRequest`,
    :class:`~spinf_stream.api.scoring.UnknownLane`, :class:`~spinf_stream.api.scoring.QueueFull`."""
    written = check(body, max_logprobs)
    lane = reads.lane_for(body.model)
    tok = lane.scorer.tokenizer
    texts, prompts = zip(*prompts_of(tok, body.prompt))
    reads.check_tokens(lane, prompts, "prompt")
    top_n = body.logprobs or 0
    got = await reads.run(lane, len(prompts), prompt_logprobs, prompts, top_n, reads.token_budget)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    choices, n_written = [], 0
    for i, (text, read) in enumerate(zip(texts, got)):
        choice, n = _choice(tok, i, text, read, body, written, stops)
        choices.append(choice)
        n_written += n
    n_prompt = sum(len(p) for p in prompts)
    return CompletionResponse(id=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=lane.model, choices=choices,
                              usage=CompletionUsage(prompt_tokens=n_prompt, completion_tokens=n_written,
                                                    total_tokens=n_prompt + n_written))
