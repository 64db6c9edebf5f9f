"""Running packed forward passes and reading choice logprobs.

The engine's core, free of packs, tokenizers and records (so ``bench/gpu_check.py`` runs it on
bare token ids, with nothing but torch, triton and transformers installed).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from spinf_stream.engine.layout import Work, build_pass, plan_passes
from spinf_stream.models.decoder import Decoder, LayerKV
from spinf_stream.engine.segment import PreparedMessage


@dataclass(frozen=True)
class RunStats:
    """What one :meth:`Engine.run` computed: ``passes`` forward passes over ``tokens_computed``
    rows, of which ``tokens_fed`` were the messages' own tokens (a message split over passes has
    its content computed once and carried) and the rest padding of the back end's last row chunk
    of each pass."""

    passes: int = 0
    tokens_computed: int = 0
    tokens_fed: int = 0


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
    sums: list[dict[int, list[float]]] = [{} for _ in prepared]
    passes = computed = fed = 0
    carried: dict[int, LayerKV] = {}  # slot -> content keys/values kept for later passes
    for works in plan_passes(prepared, token_budget):
        layout = build_pass(works, preamble_len)
        chunks = decoder.backend.row_chunks(layout.n_tokens)
        passes, fed = passes + 1, fed + layout.n_tokens
        computed += chunks[-1].stop if chunks else 0
        hidden, kept = decoder.forward(layout, prefix, [carried[w.slot] for w in works if not w.with_content])
        carried.update(zip((w.slot for w in works if w.keep_kv), kept))
        reads = list(_reads(works, layout.read_offsets))
        lps = decoder.token_logprobs(
            hidden,
            torch.tensor([r.row for r in reads], dtype=torch.int64),
            torch.tensor([r.token for r in reads], dtype=torch.int64),
        ).tolist()
        for r, lp in zip(reads, lps):
            per_q = sums[r.slot].setdefault(r.question, [0.0] * n_choices[r.question])
            per_q[r.choice] += lp  # float64 sum in token order: deterministic
        for w in works:
            if w.last:
                carried.pop(w.slot, None)
    return sums, RunStats(passes, computed, fed)
