"""Running packed forward passes and reading choice logprobs.

The engine's core, free of packs, tokenizers and records (so ``bench/gpu_check.py`` runs it on
bare token ids, with nothing but torch, triton and transformers installed).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from spinf_stream.engine.decoding import Writer, Writers, decode_work
from spinf_stream.engine.layout import PassLayout, Work, build_pass, plan_passes
from spinf_stream.models.attention import DecodeCarry, DecodeContext
from spinf_stream.models.decoder import Decoder, LayerKV
from spinf_stream.engine.segment import PreparedMessage

R = TypeVar("R")


@dataclass(frozen=True)
class RunStats:
    """What one :meth:`Engine.run` computed: ``passes`` forward passes over ``tokens_computed``
    rows, of which ``tokens_fed`` were the messages' own tokens (a message split over passes has
    its content computed once and carried) and the rest padding of the back end's last row chunk
    of each pass; ``decode_passes`` of the passes were decode steps, which wrote
    ``extracted_tokens`` tokens of extractions."""

    passes: int = 0
    tokens_computed: int = 0
    tokens_fed: int = 0
    decode_passes: int = 0
    extracted_tokens: int = 0


@dataclass(frozen=True)
class _Read:
    """One log-probability to read: ``token`` after read row ``row`` of a pass, added to choice
    ``choice`` of question ``question`` of the message at ``slot``."""

    row: int
    token: int
    slot: int
    question: int
    choice: int


def _reads(works: Sequence[Work], read_offsets: Sequence[Sequence[int]]) -> Iterator[_Read]:
    """Every read of a pass, in token order within each choice (so sums are deterministic)."""
    for w, offsets in zip(works, read_offsets):
        for bi, off in zip(w.branches, offsets):
            b = w.message.branches[bi]
            for ci, path in enumerate(b.choices):
                for read_idx, tok in path:
                    yield _Read(off + read_idx, tok, w.slot, b.question, ci)


def score_passes(
    decoder: Decoder, prepared: Sequence[PreparedMessage], token_budget: int,
    prefix: LayerKV | None, preamble_len: int, n_choices: Sequence[int],
) -> tuple[list[dict[int, list[float]]], RunStats]:
    """The engine's core, free of packs and tokenizers: pack ``prepared`` into passes of at most
    ``token_budget`` tokens, run them, and read every choice's logprob.

    Args:
        decoder: the model. prefix: the preamble's per-layer keys/values (``preamble_len``
            tokens) or ``None``. n_choices: choices per question index.
    Returns:
        Per message (in order) ``{question: [logprob per choice]}`` (float64 sums over each
        choice's tokens, in token order), and what was computed.
    """
    sums, _, stats = run_passes(decoder, prepared, token_budget, prefix, preamble_len, n_choices)
    return sums, stats


#: What :func:`run_passes` returns: the choice logprob sums, the writers' results, the stats.
PassResults = tuple[list[dict[int, list[float]]], list[dict[int, Any]], RunStats]


def run_passes(
    decoder: Decoder, prepared: Sequence[PreparedMessage], token_budget: int,
    prefix: LayerKV | None, preamble_len: int, n_choices: Sequence[int], writers: Writers | None = None,
) -> PassResults:
    """:func:`iter_passes` run to its end."""
    return drain(iter_passes(decoder, prepared, token_budget, prefix, preamble_len, n_choices, writers))


def drain(steps: Generator[None, None, R]) -> R:
    """Run a generator of passes (:func:`iter_passes`) to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def iter_passes(
    decoder: Decoder, prepared: Sequence[PreparedMessage], token_budget: int,
    prefix: LayerKV | None, preamble_len: int, n_choices: Sequence[int], writers: Writers | None = None,
) -> Generator[None, None, PassResults]:
    """:func:`score_passes`, and with ``writers`` every written question's result (an
    extraction's value, :mod:`spinf_stream.engine.decoding`, or a greedy completion,
    :mod:`spinf_stream.engine.reads`): the first passes read each extraction's answer cue,
    then decode steps run until every extraction of the batch has ended. A decode step feeds
    one token per open extraction; the content's and the branch's keys/values are kept from the
    passes that computed them, never recomputed.

    A generator that yields after each forward pass (so a caller may run other work between
    them, as the HTTP API does between a long completion's decode steps) and returns the choice
    logprob sums, per message ``{question: the writer's result}`` (``ExtractionResult`` for
    extractions), and what was computed.
    """
    sums: list[dict[int, list[float]]] = [{} for _ in prepared]
    extracted: list[dict[int, Any]] = [{} for _ in prepared]
    passes = computed = fed = decode_passes = 0
    carried: dict[int, LayerKV] = {}  # slot -> content keys/values kept for later passes
    history: dict[tuple[int, int], LayerKV] = {}  # (slot, question) -> its branch's keys/values so far
    contexts: dict[int, DecodeContext] = {}  # slot -> its content laid out for its decode rows (the back end's)
    specs = writers.specs if writers else {}
    open_by_slot: dict[int, list[Writer]] = {}
    plan = plan_passes(prepared, token_budget)
    if specs:  # a message with extractions keeps its content's keys/values for its decode steps
        plan = [[replace(w, keep_kv=True) if w.with_content and _extracts(w.message, specs) else w for w in works]
                for works in plan]

    def forward(works: list[Work], chains: list[_Chain] | None = None) -> tuple[PassLayout, torch.Tensor]:
        nonlocal passes, computed, fed
        layout = build_pass(works, preamble_len)
        owners: list[tuple[int, int]] = []  # every extraction branch's rows are kept, in pass order
        runs: list[tuple[int, int]] = []
        for w, mp in zip(works, layout.messages):
            for bi, bp in zip(w.branches, mp.branches):
                q = w.message.branches[bi].question
                if q in specs:
                    owners.append((w.slot, q))
                    runs.append((bp.start, len(bp.parents)))
        layout.kept_rows = tuple(runs)
        chunks = decoder.backend.row_chunks(layout.n_tokens, layout.decode)
        passes, fed = passes + 1, fed + layout.n_tokens
        computed += chunks[-1].stop if chunks else 0
        given = chains if chains is not None else [carried[w.slot] for w in works if not w.with_content]
        hidden, kept = decoder.forward(layout, prefix, given)
        n_content = sum(1 for w in works if w.keep_kv)
        carried.update(zip((w.slot for w in works if w.keep_kv), kept[:n_content]))
        for key, kv in zip(owners, kept[n_content:]):
            old = history.get(key)
            history[key] = kv if old is None else [
                (torch.cat((k0, k1)), torch.cat((v0, v1))) for (k0, v0), (k1, v1) in zip(old, kv)]
        return layout, hidden

    def step(hidden: torch.Tensor, tips: list[tuple[Writer, int]]) -> None:
        assert writers is not None
        rows = torch.tensor([r for _, r in tips], dtype=torch.int64)
        logits, lse = decoder.read_logits(hidden, rows)
        for i, (o, _) in enumerate(tips):
            o.step(logits[i], lse[i], writers.vocab)
            if o.done:
                history.pop((o.slot, o.question), None)

    for works in plan:
        layout, hidden = forward(works)
        reads = list(_reads(works, layout.read_offsets))
        lps = decoder.token_logprobs(
            hidden,
            torch.tensor([r.row for r in reads], dtype=torch.int64),
            torch.tensor([r.token for r in reads], dtype=torch.int64),
        ).tolist()
        for r, lp in zip(reads, lps):
            per_q = sums[r.slot].setdefault(r.question, [0.0] * n_choices[r.question])
            per_q[r.choice] += lp  # float64 sum in token order: deterministic
        tips = []
        for w, offsets in zip(works, layout.read_offsets):
            for bi, off in zip(w.branches, offsets):
                b = w.message.branches[bi]
                if b.question in specs:
                    assert writers is not None
                    o = writers.open(w.slot, b.question, b)
                    open_by_slot.setdefault(w.slot, []).append(o)
                    tips.append((o, off))  # the branch's one read: its last token
        if tips:
            step(hidden, tips)
        yield
        for w in works:
            if w.last and w.slot not in open_by_slot:
                carried.pop(w.slot, None)
    # decode steps: one pass (or more, under the budget) over the newest token of every open extraction
    while True:
        for slot in [s for s, os in open_by_slot.items() if all(o.done for o in os)]:
            for o in open_by_slot.pop(slot):
                extracted[slot][o.question] = o.result()
            carried.pop(slot, None)
            contexts.pop(slot, None)
        if not open_by_slot:
            break
        live = [o for os in open_by_slot.values() for o in os if not o.done]
        for i in range(0, len(live), max(token_budget, 1)):  # one row each
            group = live[i : i + token_budget]
            works = [decode_work(prepared[o.slot], o) for o in group]
            chains = [_Chain(carried[o.slot], history[(o.slot, o.question)],
                             contexts.setdefault(o.slot, DecodeContext(_room(prepared[o.slot], specs))))
                      for o in group]
            layout, hidden = forward(works, chains)
            decode_passes += 1
            step(hidden, [(o, offsets[0]) for o, offsets in zip(group, layout.read_offsets)])
            yield
    return sums, extracted, RunStats(passes, computed, fed, decode_passes,
                                     sum(o.tokens for per in extracted for o in per.values()))


class _Chain(Sequence[DecodeCarry]):
    """A decode step's carried keys/values, per layer (``models.attention.DecodeCarry``): the
    message's content, then its branch's history (the question's tokens and the tokens written
    before the newest), with the message's decode context, shared by its open extractions."""

    def __init__(self, content: LayerKV, branch: LayerKV, context: DecodeContext) -> None:
        self.content, self.branch, self.context = content, branch, context

    def __len__(self) -> int:
        return len(self.branch)

    def __getitem__(self, layer: int) -> DecodeCarry:  # type: ignore[override]
        return DecodeCarry(self.content[layer], self.branch[layer], self.context, layer)


def _room(m: PreparedMessage, specs: Mapping[int, Any]) -> int:
    """Keys a decode row of ``m`` may add after its content: its longest extraction branch, the
    tokens it may write and its own row (a property of the message and the pack alone)."""
    return max((len(b.tokens) + specs[b.question].max_tokens + 1 for b in m.branches if b.question in specs), default=0)


def _extracts(m: PreparedMessage, specs: Mapping[int, object]) -> bool:
    return any(b.question in specs for b in m.branches)
