"""Planning forward passes: packing tokenized messages into passes under a token budget, and
laying each pass out (which token sits where, its logical position, what it may attend to, which
rows are read).

Everything here is plain data (Python ints, then int64 tensors); the model takes a
:class:`PassLayout` as an argument and knows nothing of packs or messages. Tokenizing a message
into content and branches is :mod:`spinf_stream.segment`'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .segment import PreparedMessage

@dataclass(frozen=True)
class Work:
    """A message's content with some of its branches: the unit placed in one pass."""

    message: PreparedMessage
    branches: tuple[int, ...]  # indices into message.branches

    @property
    def n_tokens(self) -> int:
        return len(self.message.content) + sum(len(self.message.branches[i]) for i in self.branches)


def plan_passes(messages: Sequence[PreparedMessage], token_budget: int) -> list[list[Work]]:
    """Greedy, order-preserving packing of messages into passes of at most ``token_budget``
    tokens.

    A message that does not fit in an empty pass has its branches spread over several passes,
    each repeating the content (recomputing the content gives bitwise the same keys/values, so
    scores do not change). A pass may exceed the budget only when one message's content plus
    its longest branch alone does.
    """
    passes: list[list[Work]] = []
    cur: list[Work] = []
    used = 0
    for m in messages:
        if m.n_tokens <= token_budget:
            if used + m.n_tokens > token_budget and cur:
                passes.append(cur)
                cur, used = [], 0
            cur.append(Work(m, tuple(range(len(m.branches)))))
            used += m.n_tokens
            continue
        if cur:
            passes.append(cur)
            cur, used = [], 0
        group: list[int] = []
        size = len(m.content)
        for i, b in enumerate(m.branches):
            if group and size + len(b) > token_budget:
                passes.append([Work(m, tuple(group))])
                group, size = [], len(m.content)
            group.append(i)
            size += len(b)
        passes.append([Work(m, tuple(group))])
    if cur:
        passes.append(cur)
    return passes


@dataclass
class MessageRows:
    """Where one message sits in a packed pass (indices into the packed token axis).

    ``content``: ``[start, end)`` of its content rows. Branch rows are grouped per branch and
    padded to ``width`` (the message's longest branch): ``branch_rows [n_branches, width]`` (int64,
    padding points at row 0), ``branch_valid [n_branches, width]`` (bool),
    ``branch_mask [n_branches, width, width]`` (bool, query i may see key j of its own branch:
    j is an ancestor of i or i itself; padding rows see only themselves).
    """

    use_preamble: bool
    prefix_len: int
    content: tuple[int, int]
    branch_rows: torch.Tensor
    branch_valid: torch.Tensor
    branch_mask: torch.Tensor


@dataclass
class PassLayout:
    """One forward pass: ``input_ids [T]`` int64, ``positions [T]`` int64 (logical),
    ``messages`` (attention structure), ``read_rows [R]`` int64 (rows whose logits are read)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    messages: list[MessageRows]
    read_rows: torch.Tensor
    # per work item: per branch: the offset of its reads in read_rows
    read_offsets: list[list[int]] = field(default_factory=list)
    works: list[Work] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.numel())


def build_pass(works: Sequence[Work]) -> PassLayout:
    """Lay out ``works`` as one packed pass.

    Each message's branches are padded to that message's longest branch (over all its
    branches, not only those in this pass), so the attention shapes, and with them every
    reduction order, are a property of the message alone.
    """
    ids: list[int] = []
    pos: list[int] = []
    reads: list[int] = []
    rows: list[MessageRows] = []
    read_offsets: list[list[int]] = []
    for w in works:
        m = w.message
        start = len(ids)
        ids.extend(m.content)
        pos.extend(range(m.prefix_len, m.prefix_len + len(m.content)))
        base = m.prefix_len + len(m.content)
        nb = len(w.branches)
        width = max((len(b) for b in m.branches), default=1)
        b_rows = torch.zeros(nb, width, dtype=torch.int64)
        b_valid = torch.zeros(nb, width, dtype=torch.bool)
        b_mask = torch.eye(width, dtype=torch.bool).expand(nb, width, width).clone()
        offsets = []
        for g, bi in enumerate(w.branches):
            b = m.branches[bi]
            s = len(ids)
            ids.extend(b.tokens)
            pos.extend(base + d for d in b.depths)
            n = len(b)
            b_rows[g, :n] = torch.arange(s, s + n)
            b_valid[g, :n] = True
            for i, par in enumerate(b.parents):
                if par >= 0:
                    b_mask[g, i] |= b_mask[g, par]
            offsets.append(len(reads))
            reads.extend(s + r for r in b.reads)
        read_offsets.append(offsets)
        rows.append(MessageRows(m.use_preamble, m.prefix_len, (start, start + len(m.content)), b_rows, b_valid, b_mask))
    return PassLayout(
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(pos, dtype=torch.int64),
        messages=rows,
        read_rows=torch.tensor(reads, dtype=torch.int64),
        read_offsets=read_offsets,
        works=list(works),
    )


def preamble_pass(preamble_ids: Sequence[int]) -> PassLayout:
    """A pass holding only the preamble as content (no preamble cache, no branches)."""
    n = len(preamble_ids)
    row = MessageRows(
        False,
        0,
        (0, n),
        torch.zeros(0, 1, dtype=torch.int64),
        torch.zeros(0, 1, dtype=torch.bool),
        torch.zeros(0, 1, 1, dtype=torch.bool),
    )
    return PassLayout(
        input_ids=torch.tensor(list(preamble_ids), dtype=torch.int64),
        positions=torch.arange(n, dtype=torch.int64),
        messages=[row],
        read_rows=torch.zeros(0, dtype=torch.int64),
    )
