"""Planning forward passes and laying each one out.

Packing tokenized messages into passes under a token budget, and
laying each pass out (which token sits where, its logical position, what it may attend to, which
rows are read).

Everything here is plain data (Python ints, then int64 tensors on the host); the model takes a
:class:`PassLayout` as an argument and knows nothing of packs or messages. Tokenizing a message
into content and branches is :mod:`spinf_stream.engine.segment`'s job.

One description, two readers. A pass is a forest of *segments* — runs of consecutive keys, each
the parent of the next (the preamble; a message's content; a question's branch; a multi-token
choice's sub-branch) — given as ``(start, length, parent)`` in one key space::

    keys = [cached preamble (P) | content carried from earlier passes ... | this pass's rows (T)]

The Triton kernel turns the segments into per-row key ranges (``kernels.TreeMask``); the CPU path
reads the same plan per message (:class:`MessagePlan`). Both compute, for every query, attention
over exactly its ancestors (DESIGN.md "Mask"), at its logical position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from spinf_stream.engine.segment import ImageSlot, PreparedMessage


@dataclass(frozen=True)
class Work:
    """A message's content with some of its branches: the unit placed in one pass.

    ``slot``: the message's position in the sequence given to :func:`plan_passes`.
    ``with_content``: the content's tokens are fed in this pass (else its keys/values come from
    the pass that computed them, see ``keep_kv``). ``keep_kv``: this message's branches continue
    in later passes, so this pass returns the content's keys/values for them.
    ``last``: this work holds the message's last branch (its kept keys/values can go).
    ``decode``: a decode step's work: its content is everything before its one-token branch
    (the content, the question and the tokens written so far, all carried).
    """

    message: PreparedMessage
    branches: tuple[int, ...]  # indices into message.branches
    slot: int = 0
    with_content: bool = True
    keep_kv: bool = False
    decode: bool = False

    @property
    def last(self) -> bool:
        return not self.branches or self.branches[-1] == len(self.message.branches) - 1

    @property
    def n_tokens(self) -> int:
        """Tokens this work feeds to its pass."""
        own = len(self.message.content) if self.with_content else 0
        return own + sum(len(self.message.branches[i]) for i in self.branches)


def _pieces(m: PreparedMessage, slot: int, token_budget: int) -> list[Work]:
    """A message as works of at most ``token_budget`` tokens: whole when it fits, else its
    branches in order-preserving groups, the content fed with the first group only."""
    if m.n_tokens <= token_budget or len(m.branches) <= 1:
        return [Work(m, tuple(range(len(m.branches))), slot)]
    groups: list[list[int]] = [[]]
    size = len(m.content)
    for i, b in enumerate(m.branches):
        if groups[-1] and size + len(b) > token_budget:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += len(b)
    many = len(groups) > 1
    return [Work(m, tuple(g), slot, with_content=j == 0, keep_kv=j == 0 and many) for j, g in enumerate(groups)]


def plan_passes(messages: Sequence[PreparedMessage], token_budget: int) -> list[list[Work]]:
    """Greedy, order-preserving packing of messages into passes of at most ``token_budget``
    tokens fed.

    A message that does not fit in a pass alone has its branches spread over several passes:
    the first pass computes its content and keeps the content's keys/values (``Work.keep_kv``),
    later passes feed only branches, which attend to those kept keys/values. A pass exceeds the
    budget only when one message's content plus its first branch alone does.

    Raises:
        ValueError: ``token_budget < 1``.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be a positive number of tokens, got {token_budget}")
    passes: list[list[Work]] = []
    cur: list[Work] = []
    used = 0
    for slot, m in enumerate(messages):
        for w in _pieces(m, slot, token_budget):
            if cur and used + w.n_tokens > token_budget:
                passes.append(cur)
                cur, used = [], 0
            cur.append(w)
            used += w.n_tokens
    if cur:
        passes.append(cur)
    return passes


@dataclass(frozen=True)
class BranchPlan:
    """One branch in a pass: its rows ``[start, start + len(parents))``; ``parents[i]`` is the
    branch-local index of row i's parent (-1: the content's last token)."""

    start: int
    parents: tuple[int, ...]


@dataclass(frozen=True)
class MessagePlan:
    """Where one message sits in a pass, for attention (rows index the packed token axis).

    ``prefix_len``: preamble keys it attends to (0 = none; then its content holds the whole prompt).
    ``content_start``: first row of its content in this pass, or ``None`` when the content was
    computed in an earlier pass; then ``carried`` is its index in the pass's carried list.
    ``branch_width``: the longest branch over ALL the message's branches (tokens), not only those
    in this pass, so every shape the CPU path gives this message's attention is a property of
    the message alone. ``keep_kv``: return the content's keys/values after the pass.
    ``branches``: its branches in this pass, in order; their rows are consecutive.
    ``decode``: a decode step's one-row branch (see :class:`Work`).
    ``images``: ``(start, length)`` content indices of its pictures' soft tokens, each run
    visible whole to its own rows (a bidirectional block; content fed in this pass only).
    """

    prefix_len: int
    content_len: int
    content_start: int | None
    carried: int | None
    keep_kv: bool
    branch_width: int
    branches: tuple[BranchPlan, ...]
    decode: bool = False
    images: tuple[tuple[int, int], ...] = ()

    @property
    def n_keys(self) -> int:
        """Keys every branch token sees before its own branch: preamble + content."""
        return self.prefix_len + self.content_len

    @property
    def width_slots(self) -> int:
        """``W``: :attr:`branch_width` rounded up to :data:`SLOT_MULTIPLE` (own-branch keys per row
        on the CPU path)."""
        return _round_up(max(self.branch_width, 1), SLOT_MULTIPLE)


#: Own-branch key slots are a multiple of this (see models.attention: whole 16-float vectors).
SLOT_MULTIPLE = 16


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


@dataclass
class PassLayout:
    """One forward pass.

    ``input_ids [T]`` int64, ``positions [T]`` int64 (logical positions: rotary and sliding
    windows read these, never the packed index), ``read_rows [R]`` int64 (rows whose logits are
    read), ``messages`` (per work item, in order: its attention plan), ``works``, and
    ``read_offsets[w][b]``: where branch b of work w starts in ``read_rows``.

    The key space of attention is ``[preamble (preamble_len) | carried contents | pass rows]``;
    ``carried_lens`` are the carried contents' lengths in order, ``segments`` the pass's forest
    as ``(start, length, parent)`` in that key space (parent -1: a root), ``query_start`` the key
    index of pass row 0. ``kept_rows``: ``(start, length)`` runs of pass rows whose per-layer
    keys/values the forward pass returns after the kept contents' (a decode step's history).
    ``images``: ``(pass row, slot)`` of each picture tile whose content is fed: rows
    ``[row, row + slot.length)`` take the tile's soft tokens as embeddings; ``blocks``: the
    bidirectional ones' runs in key space, each visible whole to its own rows.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    read_rows: torch.Tensor
    messages: list[MessagePlan]
    works: list[Work] = field(default_factory=list)
    read_offsets: list[list[int]] = field(default_factory=list)
    preamble_len: int = 0
    carried_lens: tuple[int, ...] = ()
    segments: tuple[tuple[int, int, int], ...] = ()
    kept_rows: tuple[tuple[int, int], ...] = ()
    images: tuple[tuple[int, ImageSlot], ...] = ()
    blocks: tuple[tuple[int, int], ...] = ()

    @property
    def n_tokens(self) -> int:
        """Rows fed to the model in this pass."""
        return int(self.input_ids.numel())

    @property
    def decode(self) -> bool:
        """A pass of decode steps only (its token-wise ops may take the back end's decode row
        chunks).

        Raises:
            ValueError: decode steps mixed with other works in one pass.
        """
        kinds = {m.decode for m in self.messages}
        if len(kinds) > 1:
            raise ValueError("a pass holds decode steps or other works, not both")
        return kinds == {True}

    @property
    def query_start(self) -> int:
        """Key index of pass row 0: the preamble and the carried contents come first."""
        return self.preamble_len + sum(self.carried_lens)


def build_pass(works: Sequence[Work], preamble_len: int = 0) -> PassLayout:
    """Lay out ``works`` as one packed pass (no padding between or inside messages).

    Args:
        works: from :func:`plan_passes`, in order.
        preamble_len: tokens of the cached preamble (its keys/values come with the forward call).

    A work whose content is carried (``with_content`` False) gets the next index in the pass's
    carried list; the engine passes those contents' keys/values in that order.
    """
    ids: list[int] = []
    pos: list[int] = []
    reads: list[int] = []
    plans: list[MessagePlan] = []
    read_offsets: list[list[int]] = []
    carried_lens: list[int] = []
    # Segments are first collected with pass-row coordinates; shifted into key space at the end.
    pass_segments: list[tuple[int, int, int, bool]] = []  # (start, length, parent, parent_is_pass_row)
    carried_segments: list[tuple[int, int, int]] = []
    images: list[tuple[int, ImageSlot]] = []
    for w in works:
        m = w.message
        L = len(m.content)
        prefix = m.prefix_len if m.use_preamble else 0
        root_parent = prefix - 1 if prefix else -1  # key index in the preamble
        if w.with_content:
            start = len(ids)
            ids.extend(m.content)
            pos.extend(range(m.prefix_len, m.prefix_len + L))
            carried = None
            images.extend((start + im.start, im) for im in m.images)
            if L:
                pass_segments.append((start, L, root_parent, False))
            last_content = (start + L - 1, True) if L else (root_parent, False)
        else:
            start = None
            carried = len(carried_lens)
            cstart = preamble_len + sum(carried_lens)
            carried_lens.append(L)
            if L:
                carried_segments.append((cstart, L, root_parent))
            last_content = (cstart + L - 1, False) if L else (root_parent, False)
        base = m.prefix_len + L
        branches = []
        offsets = []
        for bi in w.branches:
            b = m.branches[bi]
            s = len(ids)
            ids.extend(b.tokens)
            pos.extend(base + d for d in b.depths)
            branches.append(BranchPlan(s, b.parents))
            offsets.append(len(reads))
            reads.extend(s + r for r in b.reads)
            # Segments of the branch's trie: a new segment wherever a token's parent is not the
            # token just before it.
            for i, par in enumerate(b.parents):
                if i > 0 and par == i - 1:
                    st, n, p, is_row = pass_segments[-1]
                    pass_segments[-1] = (st, n + 1, p, is_row)
                elif par < 0:
                    pass_segments.append((s + i, 1, last_content[0], last_content[1]))
                else:
                    pass_segments.append((s + i, 1, s + par, True))
        read_offsets.append(offsets)
        width = max((len(b) for b in m.branches), default=1)
        spans = tuple((im.start, im.length) for im in m.images if im.bidirectional) if w.with_content else ()
        plans.append(MessagePlan(prefix, L, start, carried, w.keep_kv, width, tuple(branches), w.decode, spans))
    q0 = preamble_len + sum(carried_lens)
    segments: list[tuple[int, int, int]] = []
    if preamble_len:
        segments.append((0, preamble_len, -1))
    segments.extend(carried_segments)
    for st, n, p, is_row in pass_segments:
        segments.append((q0 + st, n, q0 + p if is_row else p))
    return PassLayout(
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        read_rows=torch.tensor(reads, dtype=torch.int64),
        messages=plans,
        works=list(works),
        read_offsets=read_offsets,
        preamble_len=preamble_len,
        carried_lens=tuple(carried_lens),
        segments=tuple(segments),
        images=tuple(images),
        blocks=tuple((q0 + row, im.length) for row, im in images if im.bidirectional),
    )


def preamble_pass(preamble_ids: Sequence[int]) -> PassLayout:
    """A pass holding only the preamble as content (no preamble cache, no branches), whose
    keys/values are kept: ``forward`` returns them as its first kept entry."""
    n = len(preamble_ids)
    plan = MessagePlan(0, n, 0, None, True, 1, ())
    return PassLayout(
        input_ids=torch.tensor(list(preamble_ids), dtype=torch.int64),
        positions=torch.arange(n, dtype=torch.int64),
        read_rows=torch.zeros(0, dtype=torch.int64),
        messages=[plan],
        segments=((0, n, -1),) if n else (),
    )
