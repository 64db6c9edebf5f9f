"""Reading token sequences without a pack: label probabilities after each of several prompts
(SGLang's and vLLM's item scoring), every token's log-probability in a prompt (OpenAI's
``echo`` with ``logprobs``) and greedy completions of prompts (OpenAI's ``max_tokens``).

Both lay a request out as one tree, so the tokens its prompts share are read once:

- :func:`label_logprobs`: the prompts' longest common prefix of tokens is the content and each
  prompt's rest one branch, read at its last token for every label token.
- :func:`prompt_logprobs`: the prompts form a token trie fed as one branch (no content), read
  at every node: the trie's rows are exactly the prompts' rows, each prefix computed once.
- :func:`complete`: laid out as :func:`label_message`, each prompt's branch then written by
  the engine's decode steps (:func:`~spinf_stream.engine.runner.run_passes`), keys/values kept.

A request's numbers depend on the request alone (its tree), never on what else shares a pass.
Prompts are token ids; tokenizing them is the caller's (the API tokenizes each prompt whole).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from spinf_stream.engine.layout import build_pass, plan_passes
from spinf_stream.engine.runner import drain, iter_passes, score_passes
from spinf_stream.engine.segment import Branch, PreparedMessage
from spinf_stream.models.decoder import Decoder

#: rows whose full-vocabulary logits are held at once when reading top log-probabilities
TOP_ROWS = 64


@dataclass(frozen=True)
class LabelRequest:
    """Prompts whose next-token log-probabilities of ``labels`` are read (token ids)."""

    prompts: tuple[tuple[int, ...], ...]
    labels: tuple[int, ...]


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for i in range(n):
        if any(s[i] != first[i] for s in seqs[1:]):
            return i
    return n


def _chain(question: int, tokens: Sequence[int], paths: tuple[tuple[tuple[int, int], ...], ...]) -> Branch:
    n = len(tokens)
    return Branch(question, tuple(tokens), tuple(range(-1, n - 1)), tuple(range(n)), (n - 1,), paths)


def label_message(index: int, request: LabelRequest) -> PreparedMessage:
    """``request`` as one prepared message: content = the prompts' common prefix (all but at
    least one token of each prompt), one branch per prompt whose choices are the labels.

    Raises:
        ValueError: no prompts, an empty prompt, or no labels.
    """
    if not request.labels:
        raise ValueError("a label read needs at least one prompt and one label")
    return _prefix_message(index, request.prompts, tuple(((0, t),) for t in request.labels))


def _prefix_message(index: int, prompts: Sequence[Sequence[int]], paths: tuple[tuple[tuple[int, int], ...], ...]) -> PreparedMessage:
    """Content = the prompts' common prefix (leaving each at least one token), branch i = the
    rest of prompt i (question i), read at its last token for ``paths``."""
    if not prompts:
        raise ValueError("a read needs at least one prompt")
    if any(not p for p in prompts):
        raise ValueError("a prompt of no tokens has no next token to read")
    shared = min(_common_prefix(prompts), min(len(p) for p in prompts) - 1)
    branches = tuple(_chain(i, p[shared:], paths) for i, p in enumerate(prompts))
    return PreparedMessage(index, str(index), tuple(prompts[0][:shared]), False, 0, branches)


def label_logprobs(decoder: Decoder, requests: Sequence[LabelRequest], token_budget: int) -> list[list[list[float]]]:
    """Per request, per prompt, per label: ``log p(label | prompt)`` over the full vocabulary
    (natural log; float64 sums of the engine's fp32 reads).

    Requests are packed into passes of at most ``token_budget`` tokens like messages.
    Raises ``ValueError`` as :func:`label_message`.
    """
    prepared = [label_message(i, r) for i, r in enumerate(requests)]
    n = max((len(r.prompts) for r in requests), default=0)
    width = max((len(r.labels) for r in requests), default=0)
    sums, _ = score_passes(decoder, prepared, token_budget, None, 0, [width] * n)
    return [[sums[i][q] for q in range(len(r.prompts))] for i, r in enumerate(requests)]


@dataclass(frozen=True)
class PromptLogprobs:
    """One prompt's reads: ``token_logprobs[i]`` is ``log p(token i | tokens < i)`` (``None`` for
    token 0, which nothing predicts); ``top[i]`` the ``top_n`` most likely tokens at position i
    as ``(token id, logprob)``, most likely first (``None`` for token 0, empty when ``top_n`` is 0);
    ``next_top`` the same after the prompt's last token; ``next_token`` the most likely token
    there (ties to the lowest id: a greedy completion's first token) and ``next_logprob`` its
    log-probability."""

    tokens: tuple[int, ...]
    token_logprobs: tuple[float | None, ...]
    top: tuple[tuple[tuple[int, float], ...] | None, ...]
    next_top: tuple[tuple[int, float], ...]
    next_token: int
    next_logprob: float


def prompt_trie(index: int, prompts: Sequence[Sequence[int]]) -> tuple[PreparedMessage, list[list[int]]]:
    """The prompts as one message: no content, one branch holding their token trie, read at
    every node. Returns it and, per prompt, the branch index of each of its tokens.

    Raises:
        ValueError: no prompts, or an empty prompt.
    """
    if not prompts or any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    node: dict[tuple[int, ...], int] = {}
    nodes_of: list[list[int]] = []
    for p in prompts:
        mine = []
        for i in range(len(p)):
            key = tuple(p[: i + 1])
            if key not in node:
                node[key] = len(tokens)
                tokens.append(p[i])
                parents.append(node[key[:-1]] if i else -1)
                depths.append(i)
            mine.append(node[key])
        nodes_of.append(mine)
    branch = Branch(0, tuple(tokens), tuple(parents), tuple(depths), tuple(range(len(tokens))), ())
    return PreparedMessage(index, str(index), (), False, 0, (branch,)), nodes_of


@torch.inference_mode()
def prompt_logprobs(decoder: Decoder, prompts: Sequence[Sequence[int]], top_n: int, token_budget: int) -> list[PromptLogprobs]:
    """Every token's log-probability in each of ``prompts`` (token ids; one request), and the
    ``top_n`` most likely tokens at each position and after the last.

    The prompts are read as one trie (:func:`prompt_trie`), in one pass when it fits
    ``token_budget``, else alone in a pass of its own size. Log-probabilities are full-vocabulary,
    natural log, the engine's fp32 reads (:meth:`Decoder.token_logprobs`, :meth:`Decoder.read_logits`).

    Raises:
        ValueError: no prompts, an empty prompt, or ``top_n < 0``.
    """
    if top_n < 0:
        raise ValueError(f"top_n must be 0 or more, got {top_n}")
    message, nodes_of = prompt_trie(0, prompts)
    (works,) = plan_passes([message], token_budget)
    layout = build_pass(works)
    hidden, _ = decoder.forward(layout)
    # node j's row in hidden is j (its branch is the pass's only rows, read at every node)
    pairs = sorted({(nodes[i - 1], p[i]) for p, nodes in zip(prompts, nodes_of) for i in range(1, len(p))})
    lp: dict[tuple[int, int], float] = {}
    if pairs:
        got = decoder.token_logprobs(hidden, torch.tensor([r for r, _ in pairs]), torch.tensor([t for _, t in pairs]))
        lp = dict(zip(pairs, got.tolist()))
    tops: dict[int, tuple[tuple[int, float], ...]] = {}
    greedy: dict[int, tuple[int, float]] = {}
    lasts = {nodes[-1] for nodes in nodes_of}
    rows = sorted({n for nodes in nodes_of for n in nodes}) if top_n else sorted(lasts)
    for at in range(0, len(rows), TOP_ROWS):
        chunk = rows[at : at + TOP_ROWS]
        logits, lse = decoder.read_logits(hidden, torch.tensor(chunk))
        logprobs = logits - lse[:, None]
        best = torch.argmax(logprobs, dim=1)  # the first maximum: ties to the lowest id
        if top_n:
            values, ids = torch.topk(logprobs, min(top_n, logits.shape[1]), dim=1)
            for r, v, i in zip(chunk, values.tolist(), ids.tolist()):
                tops[r] = tuple(zip(i, v))
        for j, r in enumerate(chunk):
            if r in lasts:
                t = int(best[j])
                greedy[r] = (t, float(logprobs[j, t]))
    out = []
    for p, nodes in zip(prompts, nodes_of):
        token_lps: list[float | None] = [None] + [lp[(nodes[i - 1], p[i])] for i in range(1, len(p))]
        top: list[tuple[tuple[int, float], ...] | None] = [None] + [tops.get(nodes[i - 1], ()) for i in range(1, len(p))]
        out.append(PromptLogprobs(tuple(p), tuple(token_lps), tuple(top), tops.get(nodes[-1], ()), *greedy[nodes[-1]]))
    return out


@dataclass(frozen=True)
class CompletionSpec:
    """A greedy completion's bounds: at most ``max_tokens`` tokens (1 or more), ending before an
    end-of-text id or at the first of ``stops`` in the written text; the ``top_n`` most likely
    tokens kept at each step."""

    max_tokens: int
    stops: tuple[str, ...] = ()
    top_n: int = 0


@dataclass(frozen=True)
class Completion:
    """What a greedy completion wrote: ``ids`` its tokens (an end-of-text token is not one),
    ``logprobs`` each one's full-vocabulary log-probability, ``top`` the ``top_n`` most likely
    ``(token id, logprob)`` at each step, ``text`` the decoded tokens cut before the first stop
    string, ``finish_reason`` ``stop`` (end-of-text or a stop string) or ``length``."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[tuple[tuple[int, float], ...], ...]
    text: str
    finish_reason: Literal["stop", "length"]

    @property
    def tokens(self) -> int:
        return len(self.ids)


@dataclass
class OpenCompletion:
    """One prompt being completed (a :class:`~spinf_stream.engine.decoding.Writer`)."""

    slot: int
    question: int
    spec: CompletionSpec
    base: Branch
    eos: frozenset[int]
    decode: Callable[[list[int]], str]
    written: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    text: str = ""
    finish_reason: Literal["stop", "length"] = "length"
    done: bool = False

    def step(self, logits: torch.Tensor, lse: torch.Tensor, vocab: Sequence[bytes]) -> None:
        """The most likely token of ``logits [V]`` fp32 (ties to the lowest id); ``lse`` their logsumexp."""
        pick = int(torch.argmax(logits))  # the first maximum
        if pick in self.eos:
            self.done, self.finish_reason = True, "stop"
            return
        if self.spec.top_n:
            values, ids = torch.topk(logits, min(self.spec.top_n, logits.shape[0]))
            self.top.append(tuple(zip(ids.tolist(), (values - lse).tolist())))
        self.written.append(pick)
        self.logprobs.append(float(logits[pick] - lse))
        self.text = self.decode(self.written)
        cut = min((i for i in (self.text.find(s) for s in self.spec.stops if s) if i >= 0), default=-1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.done, self.finish_reason = True, "stop"
        elif len(self.written) >= self.spec.max_tokens:
            self.done = True

    def result(self) -> Completion:
        return Completion(tuple(self.written), tuple(self.logprobs), tuple(self.top), self.text, self.finish_reason)


@dataclass(frozen=True)
class Completions:
    """Greedy completions of a request's prompts (question i = prompt i), the
    :class:`~spinf_stream.engine.decoding.Writers` of :func:`complete`."""

    specs: dict[int, CompletionSpec]
    eos: frozenset[int]
    decode: Callable[[list[int]], str]
    vocab: Sequence[bytes] = ()

    def open(self, slot: int, question: int, base: Branch) -> OpenCompletion:
        return OpenCompletion(slot, question, self.specs[question], base, self.eos, self.decode)


def complete(decoder: Decoder, prompts: Sequence[Sequence[int]], spec: CompletionSpec, eos: Sequence[int],
             decode: Callable[[list[int]], str], token_budget: int) -> list[Completion]:
    """:func:`complete_steps` run to its end."""
    return drain(complete_steps(decoder, prompts, spec, eos, decode, token_budget))


def complete_steps(decoder: Decoder, prompts: Sequence[Sequence[int]], spec: CompletionSpec, eos: Sequence[int],
                   decode: Callable[[list[int]], str], token_budget: int) -> Generator[None, None, list[Completion]]:
    """Each of ``prompts`` (token ids; one request) completed greedily, as transformers'
    ``generate(do_sample=False)`` writes: the prompts' shared prefix read once, then one decode
    step per written token over every open prompt, keys/values kept. ``decode`` turns token ids
    into text (the tokenizer's); ``eos`` are the end-of-text ids.

    A generator that yields after each forward pass (:func:`~spinf_stream.engine.runner.iter_passes`;
    each step runs under ``torch.inference_mode``) and returns one completion per prompt.

    Raises:
        ValueError: no prompts, an empty prompt, or ``spec.max_tokens < 1``.
    """
    if spec.max_tokens < 1:
        raise ValueError(f"a completion writes at least 1 token, got max_tokens {spec.max_tokens}")
    message = _prefix_message(0, prompts, ())
    writers = Completions({i: spec for i in range(len(prompts))}, frozenset(eos), decode)
    steps = iter_passes(decoder, [message], token_budget, None, 0, [0] * len(prompts), writers)
    while True:
        with torch.inference_mode():
            try:
                next(steps)
            except StopIteration as done:
                _, written, _ = done.value
                return [written[0][i] for i in range(len(prompts))]
        yield
